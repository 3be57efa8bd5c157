OK_FORMAT = True

test = {   'name': 'q8_sampler',
    'points': [1, 1, 1, 1, 1, 1, 1, 1, 1],
    'suites': [   {   'cases': [   {   'code': '>>> rng = np.random.default_rng(0)\n'
                                               '>>> p, q = (np.array([0.5, 0.3, 0.2, 0.0]), np.array([0.1, 0.2, 0.3, 0.4]))\n'
                                               '>>> sorted({int(accept_reject(p, q, rng)) for _ in range(500)})\n'
                                               '[0, 1, 2]',
                                       'hidden': False,
                                       'locked': False},
                                   {'code': ">>> exactness_verdict(accept_reject, [0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25], n=20000, seed=1)\n'PASS'", 'hidden': False, 'locked': False},
                                   {'code': ">>> exactness_verdict(accept_reject, [0.0, 0.6, 0.4], [0.5, 0.5, 0.0], n=20000, seed=11)\n'PASS'", 'hidden': True, 'locked': False},
                                   {'code': ">>> exactness_verdict(accept_reject, [0.05, 0.45, 0.5], [0.6, 0.2, 0.2], n=20000, seed=12)\n'PASS'", 'hidden': True, 'locked': False},
                                   {'code': ">>> exactness_verdict(accept_reject, [0.4, 0.3, 0.2, 0.1], [0.1, 0.1, 0.4, 0.4], n=20000, seed=13)\n'PASS'", 'hidden': True, 'locked': False},
                                   {'code': ">>> exactness_verdict(accept_reject, [0.7, 0.1, 0.1, 0.1], [0.1, 0.3, 0.3, 0.3], n=20000, seed=14)\n'PASS'", 'hidden': True, 'locked': False},
                                   {'code': ">>> exactness_verdict(accept_reject, [0.88, 0.07, 0.045, 0.005], [0.88, 0.0, 0.12, 0.0], n=50000, seed=16)\n'PASS'", 'hidden': True, 'locked': False},
                                   {'code': ">>> exactness_verdict(accept_reject, [0.5, 0.01, 0.002, 0.488], [0.3, 0.02, 0.5, 0.18], n=50000, seed=17)\n'PASS'", 'hidden': True, 'locked': False},
                                   {   'code': '>>> rng = np.random.default_rng(15)\n>>> p, q = (np.eye(5)[3], np.full(5, 0.2))\n>>> sorted({int(accept_reject(p, q, rng)) for _ in range(300)})\n[3]',
                                       'hidden': True,
                                       'locked': False}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
