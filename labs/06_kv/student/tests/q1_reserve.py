OK_FORMAT = True

test = {   'name': 'q1_reserve',
    'points': [1, 1, 1],
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
                                   {'code': ">>> fuzz(alone('q1'), range(10))[0]\n{}", 'hidden': False, 'locked': False}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
