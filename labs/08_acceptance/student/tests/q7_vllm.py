OK_FORMAT = True

test = {   'name': 'q7_vllm',
    'points': [1, 1],
    'suites': [   {   'cases': [   {'code': '>>> [round(float(x), 6) for x in alpha_from_positions([968, 701, 466, 283], 1250)]\n[0.714328, 0.007764]', 'hidden': False, 'locked': False},
                                   {'code': '>>> [round(float(E_prom), 4), round(float(alpha_prom), 4)]\n[2.9344, 0.7143]', 'hidden': False, 'locked': False}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
