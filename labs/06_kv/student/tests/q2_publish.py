OK_FORMAT = True

test = {   'name': 'q2_publish',
    'points': [1, 1],
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
                                   {'code': ">>> fuzz(alone('q2'), range(10))\n({}, 72)", 'hidden': False, 'locked': False}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
