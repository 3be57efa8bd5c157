OK_FORMAT = True

test = {   'name': 'q2_mean_length',
    'points': [1, 1, 1, 1, 1, 1],
    'suites': [   {   'cases': [   {'code': '>>> round(float(E_counts), 4)\n2.9344', 'hidden': False, 'locked': False},
                                   {'code': '>>> round(float(E_rates), 4)\n2.9344', 'hidden': False, 'locked': False},
                                   {   'code': ">>> 'one letter A-D' if q2_choice.strip().upper() in {'A', 'B', 'C', 'D'} else 'not one of A, B, C, D'\n'one letter A-D'",
                                       'hidden': False,
                                       'locked': False},
                                   {   'code': '>>> [round(float(mean_length([10, 10, 10], 10)), 4), round(float(mean_length([0, 0, 0, 0], 50)), 4), round(float(mean_length([30, 12], 40)), 4)]\n'
                                               '[4.0, 1.0, 2.05]',
                                       'hidden': True,
                                       'locked': False},
                                   {'code': '>>> round(100 * float(draft_acceptance), 2)\n48.36', 'hidden': True, 'locked': False},
                                   {'code': ">>> q2_choice.strip().upper()\n'B'", 'hidden': True, 'locked': False}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
