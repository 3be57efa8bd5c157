OK_FORMAT = True

test = {   'name': 'q4_power',
    'points': [1, 1, 1],
    'suites': [   {   'cases': [   {'code': '>>> round(float(bound_300), 3)\n0.276', 'hidden': False, 'locked': False},
                                   {'code': '>>> int(n_for_010)\n2300', 'hidden': True, 'locked': False},
                                   {'code': '>>> round(float(tv_bound(1000, 250, 6, 0.001)), 4)\n0.2293', 'hidden': True, 'locked': False}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
