OK_FORMAT = True

test = {   'name': 'q7_vllm',
    'points': [1, 1, 1, 1, 1],
    'suites': [   {   'cases': [   {'code': '>>> [round(float(x), 6) for x in alpha_from_positions([968, 701, 466, 283], 1250)]\n[0.714328, 0.007764]', 'hidden': False, 'locked': False},
                                   {'code': '>>> [round(float(E_prom), 4), round(float(alpha_prom), 4)]\n[2.9344, 0.7143]', 'hidden': False, 'locked': False},
                                   {'code': '>>> [round(float(E_log), 4), round(float(alpha_log), 3)]\n[2.9344, 0.714]', 'hidden': True, 'locked': False},
                                   {'code': '>>> [round(float(x), 6) for x in alpha_from_positions([30, 18, 6], 40)]\n[0.613636, 0.051905]', 'hidden': True, 'locked': False},
                                   {'code': '>>> [round(float(x), 6) for x in alpha_from_positions([50, 50], 50)]\n[1.0, 0.0]', 'hidden': True, 'locked': False}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
