OK_FORMAT = True

test = {   'name': 'q1_reserve',
    'points': [1, 1, 1, 1, 1, 1, 1, 1],
    'suites': [   {   'cases': [   {   'code': ">>> m = alone('q1')(6, 4)\n"
                                               ">>> r = add_prompt(m, 'a', range(10, 17))\n"
                                               ">>> need = m.blocks_needed('a', 3)\n"
                                               ">>> s = m.allocate_slots('a', 3)\n"
                                               '>>> (need, s.positions, s.slot_mapping, r.num_computed_tokens, r.num_lookahead_tokens)\n'
                                               '(3, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9], 10, 3)',
                                       'hidden': False,
                                       'locked': False},
                                   {   'code': ">>> m = alone('q1')(8, 4)\n"
                                               ">>> r = add_prompt(m, 'a', range(10))\n"
                                               ">>> s = m.allocate_slots('a')\n"
                                               ">>> n = m.commit('a', 0, 0, [100])\n"
                                               ">>> s = m.allocate_slots('a', 3)\n"
                                               ">>> (s.positions, s.slot_mapping, r.num_computed_tokens, m.block_table('a'))\n"
                                               '([10, 11, 12, 13], [10, 11, 12, 13], 14, [0, 1, 2, 3])',
                                       'hidden': False,
                                       'locked': False},
                                   {'code': ">>> fuzz(alone('q1'), range(10))[0]\n{}", 'hidden': False, 'locked': False},
                                   {   'code': ">>> m = alone('q1')(8, 4)\n"
                                               ">>> a = add_prompt(m, 'a', range(10, 19))\n"
                                               ">>> s = m.allocate_slots('a')\n"
                                               ">>> n = m.commit('a', 0, 0, [7])\n"
                                               ">>> m.preempt('a')\n"
                                               ">>> c = add_prompt(m, 'c', [*range(10, 18), 99])\n"
                                               ">>> need = m.blocks_needed('a', 2)\n"
                                               ">>> s = m.allocate_slots('a', 2)\n"
                                               ">>> (need, s.positions, m.block_table('a')[:2] == m.block_table('c'), refusal(lambda: m.allocate_slots('a', 1), 'in flight'))\n"
                                               '(1, [8, 9, 10, 11], True, "refused, saying \'in flight\'")',
                                       'hidden': True,
                                       'locked': False},
                                   {   'code': ">>> m = alone('q1')(6, 4)\n"
                                               ">>> a = add_prompt(m, 'a', range(10, 17))\n"
                                               ">>> s = m.allocate_slots('a', 3)\n"
                                               ">>> b = add_prompt(m, 'b', range(20, 34))\n"
                                               '>>> before = manager_state(m)\n'
                                               ">>> (refusal(lambda: m.allocate_slots('b', 2), 'out of KV blocks'), refusal(lambda: m.allocate_slots('b', -1)), manager_state(m) == before)\n"
                                               '("refused, saying \'out of KV blocks\'", \'refused\', True)',
                                       'hidden': True,
                                       'locked': False},
                                   {'code': ">>> (fuzz(alone('q1'), range(1000, 1010))[0], fuzz(alone('q1'), range(1100, 1110), sliding_window=6)[0])\n({}, {})", 'hidden': True, 'locked': False},
                                   {   'code': ">>> (fuzz(alone('q1'), range(1200, 1210), num_blocks=12, block_size=2)[0], fuzz(alone('q1'), range(1300, 1310), enable_prefix_caching=False)[0])\n"
                                               '({}, {})',
                                       'hidden': True,
                                       'locked': False},
                                   {   'code': ">>> (fuzz(alone('q1'), range(1400, 1410), cancels=True)[0], fuzz(alone('q1'), range(1500, 1510), num_blocks=12, block_size=1)[0])\n({}, {})",
                                       'hidden': True,
                                       'locked': False}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
