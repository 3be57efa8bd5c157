OK_FORMAT = True

test = {   'name': 'q4_kappa',
    'points': [1],
    'suites': [{'cases': [{'code': '>>> round(float(E_iid), 4)\n2.8495', 'hidden': False, 'locked': False}], 'scored': True, 'setup': '', 'teardown': '', 'type': 'doctest'}]}
