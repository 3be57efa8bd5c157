OK_FORMAT = True

test = {   'name': 'q3_commit',
    'points': [1, 1, 1, 1, 1, 1, 1, 1, 1],
    'suites': [   {   'cases': [   {   'code': ">>> m = alone('q3')(8, 4)\n"
                                               ">>> r = add_prompt(m, 'a', range(10))\n"
                                               ">>> s = m.allocate_slots('a')\n"
                                               ">>> prefill = m.commit('a', 0, 0, [100])\n"
                                               ">>> s = m.allocate_slots('a', 3)\n"
                                               ">>> step = m.commit('a', 3, 1, [101, 7])\n"
                                               '>>> (prefill, step, r.token_ids[10:], r.num_lookahead_tokens, sorted(m.cached.values()))\n'
                                               '(10, 12, [100, 101, 7], None, [0, 1])',
                                       'hidden': False,
                                       'locked': False},
                                   {   'code': ">>> m = alone('q3')(8, 4)\n"
                                               ">>> r = add_prompt(m, 'a', [1, 2, 3])\n"
                                               ">>> (refusal(lambda: m.commit('a', 0, 0, [4]), 'no step in flight'), r.token_ids)\n"
                                               '("refused, saying \'no step in flight\'", [1, 2, 3])',
                                       'hidden': False,
                                       'locked': False},
                                   {'code': ">>> fuzz(alone('q3'), range(10))[0]\n{}", 'hidden': False, 'locked': False},
                                   {   'code': ">>> m = alone('q3')(8, 4)\n"
                                               ">>> r = add_prompt(m, 'a', range(6))\n"
                                               ">>> s = m.allocate_slots('a')\n"
                                               ">>> n = m.commit('a', 0, 0, [6])\n"
                                               ">>> s = m.allocate_slots('a', 4)\n"
                                               ">>> n = m.commit('a', 1, 1, [7, 8])\n"
                                               ">>> (n, r.num_tokens, r.num_lookahead_tokens, refusal(lambda: m.commit('a', 1, 1, [7, 8]), 'no step in flight'))\n"
                                               '(8, 9, None, "refused, saying \'no step in flight\'")',
                                       'hidden': True,
                                       'locked': False},
                                   {   'code': ">>> m = alone('q3')(8, 4)\n"
                                               ">>> r = add_prompt(m, 'a', range(13))\n"
                                               ">>> s = m.allocate_slots('a', 2)\n"
                                               ">>> n = m.commit('a', 2, 2, [1, 2, 3], num_cacheable=6)\n"
                                               '>>> first = len(m.cached)\n'
                                               ">>> s = m.allocate_slots('a')\n"
                                               ">>> n = m.commit('a', 0, 0, [4])\n"
                                               '>>> (first, [m.cached.get(k) for k in r.block_hashes])\n'
                                               '(1, [0, 1, 2, 3])',
                                       'hidden': True,
                                       'locked': False},
                                   {   'code': ">>> m, kv, t = (alone('q3')(16, 2, sliding_window=4), PagedKV(16, 2), [1, 2, 3, 4, 5, 6])\n"
                                               ">>> r = add_prompt(m, 'a', t)\n"
                                               ">>> s = toy_step(m, kv, 'a', t, [], 0, 7)\n"
                                               ">>> s = toy_step(m, kv, 'a', t, [8, 9, 10, 11], 0, 12)\n"
                                               ">>> (m.block_table('a')[:4], r.num_computed_tokens, check_invariants(m, kv, {'a': t}))\n"
                                               '([-1, -1, 2, 3], 7, [])',
                                       'hidden': True,
                                       'locked': False},
                                   {   'code': ">>> m = alone('q3')(8, 4)\n"
                                               ">>> a = add_prompt(m, 'a', [1, 2, 3])\n"
                                               ">>> s = m.allocate_slots('a', 2)\n"
                                               ">>> m.preempt('a')\n"
                                               '>>> before = manager_state(m)\n'
                                               ">>> (refusal(lambda: m.commit('a', 1, 1, [4, 5]), 'no step in flight'), manager_state(m) == before)\n"
                                               '("refused, saying \'no step in flight\'", True)',
                                       'hidden': True,
                                       'locked': False},
                                   {   'code': ">>> (fuzz(alone('q3'), range(3000, 3010))[0], fuzz(alone('q3'), range(3100, 3110), sliding_window=6)[0], fuzz(alone('q3'), range(3200, 3210), "
                                               'num_blocks=12, block_size=2, sliding_window=5)[0])\n'
                                               '({}, {}, {})',
                                       'hidden': True,
                                       'locked': False},
                                   {   'code': ">>> (fuzz(alone('q3'), range(3300, 3310), cancels=True)[0], fuzz(alone('q3'), range(3400, 3410), enable_prefix_caching=False)[0], fuzz(alone('q3'), "
                                               'range(3500, 3510), num_blocks=16, block_size=1, sliding_window=2)[0])\n'
                                               '({}, {}, {})',
                                       'hidden': True,
                                       'locked': False}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
