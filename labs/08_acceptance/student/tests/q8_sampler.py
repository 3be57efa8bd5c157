OK_FORMAT = True

test = {   'name': 'q8_sampler',
    'points': [1, 1],
    'suites': [   {   'cases': [   {   'code': '>>> rng = np.random.default_rng(0)\n'
                                               '>>> p, q = (np.array([0.5, 0.3, 0.2, 0.0]), np.array([0.1, 0.2, 0.3, 0.4]))\n'
                                               '>>> sorted({int(accept_reject(p, q, rng)) for _ in range(500)})\n'
                                               '[0, 1, 2]',
                                       'hidden': False,
                                       'locked': False},
                                   {'code': ">>> exactness_verdict(accept_reject, [0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25], n=20000, seed=1)\n'PASS'", 'hidden': False, 'locked': False}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
