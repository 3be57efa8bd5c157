OK_FORMAT = True

test = {   'name': 'q2_publish',
    'points': [1, 1, 1, 1, 1, 1, 1],
    'suites': [   {   'cases': [   {   'code': ">>> m = alone('q2')(8, 4)\n"
                                               ">>> r = add_prompt(m, 'a', range(10))\n"
                                               ">>> s = m.allocate_slots('a')\n"
                                               ">>> n = m.commit('a', 0, 0, [100])\n"
                                               '>>> after_prefill = sorted(m.cached.values())\n'
                                               ">>> s = m.allocate_slots('a', 3)\n"
                                               ">>> n = m.commit('a', 3, 1, [101, 7])\n"
                                               '>>> after_step = sorted(m.cached.values())\n'
                                               ">>> s = m.allocate_slots('a', 2)\n"
                                               ">>> n = m.commit('a', 1, 0, [8])\n"
                                               '>>> (after_prefill, after_step, sorted(m.cached.values()), r.num_cached_blocks)\n'
                                               '([0, 1], [0, 1], [0, 1, 2], 3)',
                                       'hidden': False,
                                       'locked': False},
                                   {'code': ">>> fuzz(alone('q2'), range(10))\n({}, 72)", 'hidden': False, 'locked': False},
                                   {   'code': ">>> m = alone('q2')(10, 4)\n"
                                               ">>> a = add_prompt(m, 'a', range(9))\n"
                                               ">>> b = add_prompt(m, 'b', [*range(8), 50])\n"
                                               ">>> sa = m.allocate_slots('a')\n"
                                               ">>> sb = m.allocate_slots('b')\n"
                                               ">>> na = m.commit('a', 0, 0, [1])\n"
                                               ">>> nb = m.commit('b', 0, 0, [2])\n"
                                               ">>> ([m.cached[k] for k in a.block_hashes], [x in m.block_hash for x in m.block_table('b')], b.num_cached_blocks)\n"
                                               '([0, 1], [False, False, False], 2)',
                                       'hidden': True,
                                       'locked': False},
                                   {   'code': ">>> m, kv, t = (alone('q2')(16, 2, sliding_window=2), PagedKV(16, 2), [1, 2, 3, 4])\n"
                                               ">>> r = add_prompt(m, 'a', t)\n"
                                               ">>> s = toy_step(m, kv, 'a', t, [], 0, 5)\n"
                                               ">>> s = toy_step(m, kv, 'a', t, [6, 7, 8, 9], 4, 10)\n"
                                               ">>> s = toy_step(m, kv, 'a', t, [11], 1, 12)\n"
                                               ">>> (m.block_table('a'), sorted(m.cached.values()), r.num_cached_blocks, check_invariants(m, kv, {'a': t}))\n"
                                               '([-1, -1, -1, -1, -1, 5], [0, 1, 4], 5, [])',
                                       'hidden': True,
                                       'locked': False},
                                   {   'code': ">>> m = alone('q2')(8, 4)\n"
                                               ">>> r = add_prompt(m, 'a', range(13))\n"
                                               ">>> s = m.allocate_slots('a', 2)\n"
                                               ">>> n = m.commit('a', 2, 2, [1, 2, 3], num_cacheable=6)\n"
                                               '>>> first = (sorted(m.cached.values()), r.num_cached_blocks)\n'
                                               ">>> s = m.allocate_slots('a')\n"
                                               ">>> n = m.commit('a', 0, 0, [4])\n"
                                               '>>> (first, sorted(m.cached.values()), r.num_cached_blocks)\n'
                                               '(([0], 1), [0, 1, 2, 3], 4)',
                                       'hidden': True,
                                       'locked': False},
                                   {   'code': ">>> (fuzz(alone('q2'), range(2000, 2010)), fuzz(alone('q2'), range(2100, 2110), sliding_window=6))\n(({}, 75), ({}, 60))",
                                       'hidden': True,
                                       'locked': False},
                                   {   'code': ">>> (fuzz(alone('q2'), range(2200, 2210), num_blocks=12, block_size=2, sliding_window=5), fuzz(alone('q2'), range(2300, 2310), num_blocks=16, "
                                               'block_size=1, sliding_window=2))\n'
                                               '(({}, 81), ({}, 97))',
                                       'hidden': True,
                                       'locked': False}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
