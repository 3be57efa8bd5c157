OK_FORMAT = True

test = {   'name': 'q3_alpha',
    'points': [1, 1, 1, 1, 1, 1],
    'suites': [   {   'cases': [   {'code': '>>> [int(x) for x in HIST[KAPPA]]\n[282, 267, 235, 183, 283]', 'hidden': False, 'locked': False},
                                   {'code': '>>> [round(float(alpha_hat), 6), round(float(alpha_se), 6)]\n[0.714328, 0.007764]', 'hidden': False, 'locked': False},
                                   {'code': '>>> [int(x) for x in hist_from_positions([9, 4], 10)]\n[1, 5, 4]', 'hidden': True, 'locked': False},
                                   {'code': '>>> [round(float(x), 6) for x in fit_alpha_hist({2: [30, 40, 130], 5: [50, 60, 70, 80, 90, 150]})]\n[0.814978, 0.00815]', 'hidden': True, 'locked': False},
                                   {   'code': '>>> [[round(float(x), 6) for x in fit_alpha_hist({1: [10, 30]})], [round(float(x), 6) for x in fit_alpha_hist({3: [0, 0, 0, 40]})]]\n'
                                               '[[0.75, 0.068465], [1.0, 0.0]]',
                                       'hidden': True,
                                       'locked': False},
                                   {'code': '>>> [round(float(alpha_low), 4), round(float(alpha_high), 4)]\n[0.6991, 0.7295]', 'hidden': True, 'locked': False}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
