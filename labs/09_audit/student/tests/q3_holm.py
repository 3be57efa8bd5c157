OK_FORMAT = True

test = {   'name': 'q3_holm',
    'points': [1],
    'suites': [   {   'cases': [{'code': '>>> [round(x, 4) for x in holm([0.01, 0.04, 0.03, 0.5])]\n[0.04, 0.09, 0.09, 0.5]', 'hidden': False, 'locked': False}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
