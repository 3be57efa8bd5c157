OK_FORMAT = True

test = {   'name': 'q6_iid',
    'points': [1, 1, 1],
    'suites': [   {   'cases': [   {'code': '>>> [round(float(x), 6) for x in iid_expected(0.5, 3)]\n[0.5, 0.25, 0.125, 0.125]', 'hidden': False, 'locked': False},
                                   {'code': '>>> [round(float(chi2_stat), 3), int(chi2_df)]\n[58.634, 3]', 'hidden': False, 'locked': False},
                                   {   'code': ">>> 'one letter A-D' if q6_choice.strip().upper() in {'A', 'B', 'C', 'D'} else 'not one of A, B, C, D'\n'one letter A-D'",
                                       'hidden': False,
                                       'locked': False}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
