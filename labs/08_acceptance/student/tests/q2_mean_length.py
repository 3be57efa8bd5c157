OK_FORMAT = True

test = {   'name': 'q2_mean_length',
    'points': [1, 1, 1],
    'suites': [   {   'cases': [   {'code': '>>> round(float(E_counts), 4)\n2.9344', 'hidden': False, 'locked': False},
                                   {'code': '>>> round(float(E_rates), 4)\n2.9344', 'hidden': False, 'locked': False},
                                   {   'code': ">>> 'one letter A-D' if q2_choice.strip().upper() in {'A', 'B', 'C', 'D'} else 'not one of A, B, C, D'\n'one letter A-D'",
                                       'hidden': False,
                                       'locked': False}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
