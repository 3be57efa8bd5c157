OK_FORMAT = True

test = {   'name': 'q1_rates',
    'points': [1, 1, 1, 1, 1],
    'suites': [   {   'cases': [   {'code': '>>> [round(float(x), 4) for x in r]\n[0.7744, 0.5608, 0.3728, 0.2264]', 'hidden': False, 'locked': False},
                                   {'code': '>>> [round(float(x), 4) for x in c]\n[0.7744, 0.7242, 0.6648, 0.6073]', 'hidden': False, 'locked': False},
                                   {'code': '>>> [round(float(x), 4) for x in unconditional_rates([90, 45, 9], 120)]\n[0.75, 0.375, 0.075]', 'hidden': True, 'locked': False},
                                   {'code': '>>> [round(float(x), 4) for x in conditional_from_unconditional([0.5, 0.25, 0.0, 0.0])]\n[0.5, 0.5, 0.0, 0.0]', 'hidden': True, 'locked': False},
                                   {   'code': '>>> [round(float(x), 6) for x in conditional_from_unconditional([0.6 ** i for i in range(1, 6)])]\n[0.6, 0.6, 0.6, 0.6, 0.6]',
                                       'hidden': True,
                                       'locked': False}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
