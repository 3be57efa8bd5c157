OK_FORMAT = True

test = {   'name': 'q4_kappa',
    'points': [1, 1, 1, 1],
    'suites': [   {   'cases': [   {'code': '>>> round(float(E_iid), 4)\n2.8495', 'hidden': False, 'locked': False},
                                   {'code': '>>> int(kappa_opt)\n3', 'hidden': True, 'locked': False},
                                   {'code': '>>> [round(float(speedup_opt), 4), round(float(speedup_now), 4)]\n[1.7318, 1.7165]', 'hidden': True, 'locked': False},
                                   {'code': '>>> round(float(E_gap), 4)\n0.0849', 'hidden': True, 'locked': False}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
