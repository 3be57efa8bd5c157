OK_FORMAT = True

test = {   'name': 'q3_holm',
    'points': [1, 1, 1],
    'suites': [   {   'cases': [   {'code': '>>> [round(x, 4) for x in holm([0.01, 0.04, 0.03, 0.5])]\n[0.04, 0.09, 0.09, 0.5]', 'hidden': False, 'locked': False},
                                   {'code': '>>> [round(x, 4) for x in holm([0.2, 0.001, 0.02, 0.019, 0.9])]\n[0.4, 0.005, 0.076, 0.076, 0.9]', 'hidden': True, 'locked': False},
                                   {'code': '>>> [round(x, 4) for x in holm([0.6, 0.5])]\n[1.0, 1.0]', 'hidden': True, 'locked': False}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
