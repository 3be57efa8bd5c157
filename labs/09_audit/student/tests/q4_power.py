OK_FORMAT = True

test = {   'name': 'q4_power',
    'points': [1],
    'suites': [{'cases': [{'code': '>>> round(float(bound_300), 3)\n0.276', 'hidden': False, 'locked': False}], 'scored': True, 'setup': '', 'teardown': '', 'type': 'doctest'}]}
