OK_FORMAT = True

test = {   'name': 'q5_sweep',
    'points': [1, 1, 1, 1, 1, 1],
    'suites': [   {   'cases': [   {'code': ">>> [int(row['batch']) for row in rows]\n[1, 2, 4, 8, 16, 32]", 'hidden': False, 'locked': False},
                                   {   'code': ">>> 'speedups match your rows' if [float(s) for s in speedups] == [float(row['speedup']) for row in rows] else 'speedups differ from rows'\n"
                                               "'speedups match your rows'",
                                       'hidden': False,
                                       'locked': False},
                                   {   'code': '>>> from speclab.sweep import measured_crossing\n'
                                               ">>> mine, lib = (float(crossing), float(measured_crossing([row['batch'] for row in rows], [row['speedup'] for row in rows])))\n"
                                               ">>> 'crossing matches your table' if mine == lib or abs(mine - lib) <= 1e-06 * max(1.0, abs(lib)) else f'crossing {mine} but your table crosses at "
                                               "{lib}'\n"
                                               "'crossing matches your table'",
                                       'hidden': False,
                                       'locked': False},
                                   {   'code': '>>> [round(float(crossing_batch([1, 2, 4, 8], [1.8, 1.4, 0.9, 0.6])), 4), round(float(crossing_batch([1, 2, 4, 8, 16], [2.0, 1.5, 1.2, 1.1, 1.0])), '
                                               '4)]\n'
                                               '[3.4822, 16.0]',
                                       'hidden': True,
                                       'locked': False},
                                   {'code': '>>> [float(crossing_batch([1, 2, 4], [1.5, 1.2, 1.1])), float(crossing_batch([1, 2, 4], [0.9, 0.8, 0.7]))]\n[inf, 0.0]', 'hidden': True, 'locked': False},
                                   {   'code': '>>> from speclab.sweep import measured_crossing\n'
                                               '>>> rng = np.random.default_rng(5)\n'
                                               '>>> cases = [sorted(rng.uniform(0.3, 2.5, size=6), reverse=True) for _ in range(20)]\n'
                                               '>>> bad = [s for s in cases if abs(float(crossing_batch([1, 2, 4, 8, 16, 32], s)) - float(measured_crossing([1, 2, 4, 8, 16, 32], s))) > 1e-09]\n'
                                               ">>> f'{len(cases) - len(bad)} of {len(cases)} agree with measured_crossing'\n"
                                               "'20 of 20 agree with measured_crossing'",
                                       'hidden': True,
                                       'locked': False}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
