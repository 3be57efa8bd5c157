OK_FORMAT = True

test = {   'name': 'q5_verdict',
    'points': [1, 1],
    'suites': [   {   'cases': [   {'code': ">>> sorted(verdicts)\n['pair_1', 'pair_2', 'pair_3', 'pair_4', 'pair_5', 'pair_6', 'pair_7']", 'hidden': False, 'locked': False},
                                   {'code': ">>> [verdicts[name][0] for name in PAIRS]\n['exact', 'broken', 'exact', 'broken', 'broken', 'exact', 'broken']", 'hidden': False, 'locked': False}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
