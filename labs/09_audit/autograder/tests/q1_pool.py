OK_FORMAT = True

test = {   'name': 'q1_pool',
    'points': [1, 1, 1, 1],
    'suites': [   {   'cases': [   {'code': ">>> sorted(example.items())\n[('ab', 'a'), ('ac', 'a'), ('ad', 'a'), ('x', 'x'), ('y', '')]", 'hidden': False, 'locked': False},
                                   {   'code': ">>> [len(set(b)), sorted(set(b))[:4]] if (b := pool(RECORDINGS['pair_1']['cells'][1]['audited'], "
                                               "RECORDINGS['pair_1']['cells'][1]['reference']).values()) else None\n"
                                               "[26, ['', 'exc)', 'exc_', 'f']]",
                                       'hidden': False,
                                       'locked': False},
                                   {   'code': ">>> sorted(pool({'abc': 4, 'abd': 4, 'b': 30}, {'abc': 1, 'ab': 2, 'c': 2}, min_count=5).items())\n"
                                               "[('ab', ''), ('abc', 'abc'), ('abd', ''), ('b', 'b'), ('c', '')]",
                                       'hidden': True,
                                       'locked': False},
                                   {   'code': ">>> sorted(Counter(pool({'hello': 9, 'help': 9, 'hex': 3}, {'hello': 2, 'heap': 1}, min_count=10).values()).items())\n"
                                               "[('', 1), ('he', 2), ('hello', 1)]",
                                       'hidden': True,
                                       'locked': False}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
