OK_FORMAT = True

test = {   'name': 'q5_sweep',
    'points': [1, 1, 1],
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
                                       'locked': False}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
