OK_FORMAT = True

test = {   'name': 'q4_cancel',
    'points': [1, 1, 1, 1, 1, 1, 1],
    'suites': [   {   'cases': [   {   'code': ">>> m = alone('q4')(6, 4)\n"
                                               ">>> r = add_prompt(m, 'f', range(20, 29))\n"
                                               ">>> s = m.allocate_slots('f', 2)\n"
                                               ">>> m.cancel('f', 0)\n"
                                               '>>> after = (r.num_computed_tokens, r.num_lookahead_tokens, m.cached)\n'
                                               ">>> s = m.allocate_slots('f', 2)\n"
                                               '>>> (after, s.positions)\n'
                                               '((0, None, {}), [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10])',
                                       'hidden': False,
                                       'locked': False},
                                   {'code': ">>> fuzz(alone('q4'), range(10), cancels=True)[0]\n{}", 'hidden': False, 'locked': False},
                                   {   'code': ">>> m = alone('q4')(6, 4)\n"
                                               ">>> r = add_prompt(m, 'f', range(20, 29))\n"
                                               ">>> s = m.allocate_slots('f', 2)\n"
                                               '>>> before = manager_state(m)\n'
                                               ">>> (sorted({refusal(lambda: m.cancel('f', v), 'num_computed_tokens') for v in (10, -1, 2.0, True, None)}), manager_state(m) == before)\n"
                                               '(["refused, saying \'num_computed_tokens\'"], True)',
                                       'hidden': True,
                                       'locked': False},
                                   {   'code': ">>> m = alone('q4')(6, 4)\n"
                                               ">>> r = add_prompt(m, 'f', range(20, 29))\n"
                                               ">>> s = m.allocate_slots('f', 2)\n"
                                               ">>> m.cancel('f', 0)\n"
                                               '>>> before = manager_state(m)\n'
                                               ">>> (refusal(lambda: m.cancel('f', 0), 'no step in flight'), manager_state(m) == before, refusal(lambda: m.cancel('nobody', 0)))\n"
                                               '("refused, saying \'no step in flight\'", True, \'refused\')',
                                       'hidden': True,
                                       'locked': False},
                                   {   'code': ">>> m, kv, t = (alone('q4')(8, 4), PagedKV(8, 4), list(range(20, 29)))\n"
                                               ">>> r = add_prompt(m, 'f', t)\n"
                                               ">>> s = toy_step(m, kv, 'f', t, [], 0, 5)\n"
                                               ">>> s = m.allocate_slots('f', 3)\n"
                                               ">>> m.cancel('f', 9)\n"
                                               '>>> cached = sorted(m.cached.values())\n'
                                               ">>> s = toy_step(m, kv, 'f', t, [1, 2, 3], 2, 4)\n"
                                               ">>> (cached, s.positions, r.num_computed_tokens, check_invariants(m, kv, {'f': t}))\n"
                                               '([0, 1], [9, 10, 11, 12], 12, [])',
                                       'hidden': True,
                                       'locked': False},
                                   {   'code': ">>> (fuzz(alone('q4'), range(4000, 4010), cancels=True)[0], fuzz(alone('q4'), range(4100, 4110), cancels=True, sliding_window=6)[0])\n({}, {})",
                                       'hidden': True,
                                       'locked': False},
                                   {   'code': ">>> (fuzz(alone('q4'), range(4200, 4210), cancels=True, num_blocks=12, block_size=2)[0], fuzz(alone('q4'), range(4300, 4310), cancels=True, "
                                               'enable_prefix_caching=False)[0])\n'
                                               '({}, {})',
                                       'hidden': True,
                                       'locked': False}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
