OK_FORMAT = True

test = {   'name': 'q2_two_sample',
    'points': [1, 1],
    'suites': [   {   'cases': [   {   'code': '>>> [(round(s, 3), df, round(p, 4)) for s, df, p in pair_1_tests]\n[(11.692, 16, 0.7649), (32.568, 25, 0.1422), (5.304, 10, 0.87)]',
                                       'hidden': False,
                                       'locked': False},
                                   {'code': ">>> [round(x, 4) for x in two_sample({'a': 30, 'b': 10}, {'a': 10, 'b': 30})]\n[20.0, 1, 0.0]", 'hidden': False, 'locked': False}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
