OK_FORMAT = True

test = {   'name': 'q3_commit',
    'points': [1, 1, 1],
    'suites': [   {   'cases': [   {   'code': ">>> m = alone('q3')(8, 4)\n"
                                               ">>> r = add_prompt(m, 'a', range(10))\n"
                                               ">>> s = m.allocate_slots('a')\n"
                                               ">>> prefill = m.commit('a', 0, 0, [100])\n"
                                               ">>> s = m.allocate_slots('a', 3)\n"
                                               ">>> step = m.commit('a', 3, 1, [101, 7])\n"
                                               '>>> (prefill, step, r.token_ids[10:], r.num_lookahead_tokens, sorted(m.cached.values()))\n'
                                               '(10, 12, [100, 101, 7], None, [0, 1])',
                                       'hidden': False,
                                       'locked': False},
                                   {   'code': ">>> m = alone('q3')(8, 4)\n"
                                               ">>> r = add_prompt(m, 'a', [1, 2, 3])\n"
                                               ">>> (refusal(lambda: m.commit('a', 0, 0, [4]), 'no step in flight'), r.token_ids)\n"
                                               '("refused, saying \'no step in flight\'", [1, 2, 3])',
                                       'hidden': False,
                                       'locked': False},
                                   {'code': ">>> fuzz(alone('q3'), range(10))[0]\n{}", 'hidden': False, 'locked': False}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
