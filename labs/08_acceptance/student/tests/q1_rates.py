OK_FORMAT = True

test = {   'name': 'q1_rates',
    'points': [1, 1],
    'suites': [   {   'cases': [   {'code': '>>> [round(float(x), 4) for x in r]\n[0.7744, 0.5608, 0.3728, 0.2264]', 'hidden': False, 'locked': False},
                                   {'code': '>>> [round(float(x), 4) for x in c]\n[0.7744, 0.7242, 0.6648, 0.6073]', 'hidden': False, 'locked': False}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
