OK_FORMAT = True

test = {   'name': 'q1_pool',
    'points': [1, 1],
    'suites': [   {   'cases': [   {'code': ">>> sorted(example.items())\n[('ab', 'a'), ('ac', 'a'), ('ad', 'a'), ('x', 'x'), ('y', '')]", 'hidden': False, 'locked': False},
                                   {   'code': ">>> [len(set(b)), sorted(set(b))[:4]] if (b := pool(RECORDINGS['pair_1']['cells'][1]['audited'], "
                                               "RECORDINGS['pair_1']['cells'][1]['reference']).values()) else None\n"
                                               "[26, ['', 'exc)', 'exc_', 'f']]",
                                       'hidden': False,
                                       'locked': False}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
