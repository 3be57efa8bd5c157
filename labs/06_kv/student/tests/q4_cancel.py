OK_FORMAT = True

test = {   'name': 'q4_cancel',
    'points': [1, 1],
    'suites': [   {   'cases': [   {   'code': ">>> m = alone('q4')(6, 4)\n"
                                               ">>> r = add_prompt(m, 'f', range(20, 29))\n"
                                               ">>> s = m.allocate_slots('f', 2)\n"
                                               ">>> m.cancel('f', 0)\n"
                                               '>>> after = (r.num_computed_tokens, r.num_lookahead_tokens, m.cached)\n'
                                               ">>> s = m.allocate_slots('f', 2)\n"
                                               '>>> (after, s.positions)\n'
                                               '((0, None, {}), [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10])',
                                       'hidden': False,
                                       'locked': False},
                                   {'code': ">>> fuzz(alone('q4'), range(10), cancels=True)[0]\n{}", 'hidden': False, 'locked': False}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
