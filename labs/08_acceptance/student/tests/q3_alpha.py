OK_FORMAT = True

test = {   'name': 'q3_alpha',
    'points': [1, 1],
    'suites': [   {   'cases': [   {'code': '>>> [int(x) for x in HIST[KAPPA]]\n[282, 267, 235, 183, 283]', 'hidden': False, 'locked': False},
                                   {'code': '>>> [round(float(alpha_hat), 6), round(float(alpha_se), 6)]\n[0.714328, 0.007764]', 'hidden': False, 'locked': False}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
