OK_FORMAT = True

test = {   'name': 'q5_verdict',
    'points': [1, 1, 1, 1, 1, 1, 1, 1],
    'suites': [   {   'cases': [   {'code': ">>> sorted(verdicts)\n['pair_1', 'pair_2', 'pair_3', 'pair_4', 'pair_5', 'pair_6', 'pair_7']", 'hidden': False, 'locked': False},
                                   {'code': ">>> [verdicts[name][0] for name in PAIRS]\n['exact', 'broken', 'exact', 'broken', 'broken', 'exact', 'broken']", 'hidden': False, 'locked': False},
                                   {   'code': ">>> [verdicts[name][1] for name in PAIRS[:4]]\n[None, ('raise ValueError(', 't0.8,p0.6'), None, ('with open(', 't0.8,p0.6')]",
                                       'hidden': True,
                                       'locked': False},
                                   {'code': ">>> [verdicts[name][1] for name in PAIRS[4:]]\n[('with open(', 't0.8,p0.6'), None, ('with open(', 't1.0')]", 'hidden': True, 'locked': False},
                                   {   'code': ">>> audit_recording({'pair': 'hidden_1', 'cells': [{'prompt': 'In 1492,', 'setting': 't0.8,p0.6', 'fields': {'temperature': 0.8, 'top_p': 0.6}, "
                                               "'max_tokens': 1, 'n': 300, 'audited': {'\\n': 40, ' 0': 32, ' 2': 21, ' U': 18, ' 1': 17, '0': 13, ' (': 11, ' 6': 8, ' 3': 8, '\\n   ': 7, ' 8': 7, "
                                               '\'4\': 6, \' 5\': 6, \' so\': 5, \' 4\': 4, \' and\': 4, \' S\': 3, \' E\': 3, \'2\': 3, \'8\': 3, " \'": 3, \'3\': 3, \'10\': 3, \' D\': 3, \' but\': '
                                               '2, \'6\': 2, \' 10\': 2, \' since\': 2, \' IN\': 2, \' "\': 2, \' C\': 2, \' I\': 2, \' G\': 2, \' P\': 2, \' #\': 2, \' M\': 2, \'1\': 2, \' [\': 2, '
                                               "' bytes': 2, ' etc': 2, ' 9': 2, ' 12': 1, ' d': 1, '\\n\\n     ': 1, ' R': 1, ' un': 1, '\\\\': 1, ' NO': 1, ' inclu': 1, ' \\\\': 1, ' |': 1, "
                                               "'False': 1, 'Not': 1, ' L': 1, ' str': 1, '0000': 1, '\\n        ': 1, ' dist': 1, '\\n            ': 1, '     ': 1, ' -': 1, ' has': 1, '-': 1, '+': "
                                               '1, \' make\': 1, \'\\n               \': 1, "\')": 1, \' DeprecationWarning\': 1, \' even\': 1, \' client\': 1, \' the\': 1, \'**\': 1, \' B\': 1, \' '
                                               "Un': 1, ' A': 1, ' N': 1}, 'reference': {'\\n': 61, ' 0': 53, ' U': 40, ' 2': 38, ' 1': 28, '0': 26, ' 3': 16, ' (': 14, ' and': 9, ' 4': 8, ' #': "
                                               "7}}, {'prompt': '    return self.', 'setting': 't0.8,p0.6', 'fields': {'temperature': 0.8, 'top_p': 0.6}, 'max_tokens': 1, 'n': 300, 'audited': {'tk': "
                                               "59, 'get': 27, 'data': 20, 'name': 13, 'encoding': 8, 'max': 7, 'create': 7, 'write': 5, 'add': 5, 're': 5, 'parse': 5, 'set': 4, 'format': 4, 'find': "
                                               "4, 'raw': 4, 'call': 3, 'compile': 3, 'error': 3, 'size': 3, 'buffer': 2, 'headers': 2, 'option': 2, 'check': 2, 'class': 2, 'make': 2, 's': 2, 'at': "
                                               "2, 'returncode': 2, 'header': 2, 'configure': 2, 'from': 2, 'default': 2, 'AT': 1, 'first': 1, 'commands': 1, 'current': 1, 'time': 1, 'is': 1, ' "
                                               "new': 1, 'eq': 1, 'an': 1, 'directory': 1, 'test': 1, 'sock': 1, 'h': 1, 'z': 1, 'multip': 1, 'just': 1, ' max': 1, 't': 1, 'der': 1, "
                                               '\'""\': 1, \'closed\': 1, \'path\': 1, \'repr\': 1, \'convert\': 1, \'ow\': 1, \'subwidget\': 1, \'len\': 1, \'main\': 1, \'read\': 1, \'length\': 1, '
                                               "'handle': 1, ' load': 1, 'offset': 1, 'iter': 1, 'library': 1, ' signature': 1, 'et': 1, 'files': 1, 'r': 1, 'None': 1, 'fill': 1, 'file': 1, 'str': "
                                               "1, 'index': 1, 'cmd': 1, 'copy': 1, 'id': 1, '    ': 1, 'w': 1, 'indent': 1, 'scripts': 1, 'command': 1, 'sampwidth': 1, 'for': 1, 'string': 1, 'i': "
                                               "1, 'def': 1, '(': 1, 'sa': 1, 'distribution': 1, 'compiler': 1, ' y': 1, 'wh': 1, 'be': 1, ' string': 1, 'debug': 1, 'update': 1, 'month': 1, '[-': 1, "
                                               '"(\'": 1, \'strict\': 1, \'parser\': 1, " \'": 1, \'flags\': 1, \'bound\': 1, \'O\': 1, \'RO\': 1, \'url\': 1, \' H\': 1, \'rc\': 1, \'lineno\': 1, '
                                               "'help': 1, '*': 1, 'g': 1, ' self': 1}, 'reference': {'tk': 95, 'get': 53, 'data': 18, 'name': 17, 'class': 8, 'format': 8, 'compile': 8, 'command': "
                                               "6, 'max': 6, 'write': 6, 'create': 6, 'find': 6, 'headers': 6, 'default': 6, 'encoding': 5, 'option': 5, 'text': 5, 'size': 5, 'file': 4, 'add': 4, "
                                               "'parse': 4, 'raw': 4, 'distribution': 4, 'configure': 3, 'read': 3, 'set': 2, 'me': 2, 're': 1}}]})\n"
                                               "('broken', ('In 1492,', 't0.8,p0.6'))",
                                       'hidden': True,
                                       'locked': False},
                                   {   'code': ">>> audit_recording({'pair': 'hidden_2', 'cells': [{'prompt': 'In 1492,', 'setting': 't0.8,p0.6', 'fields': {'temperature': 0.8, 'top_p': 0.6}, "
                                               "'max_tokens': 1, 'n': 300, 'audited': {'\\n': 68, ' 0': 61, ' 2': 33, ' U': 33, ' 1': 27, '0': 27, ' (': 14, ' #': 13, ' 3': 12, ' and': 7, ' 4': 5}, "
                                               "'reference': {'\\n': 76, ' 0': 67, ' U': 34, ' 2': 25, ' (': 25, '0': 20, ' 1': 16, ' 3': 15, ' 4': 10, ' and': 7, ' #': 5}}, {'prompt': '    return "
                                               "self.', 'setting': 't0.8,p0.6', 'fields': {'temperature': 0.8, 'top_p': 0.6}, 'max_tokens': 1, 'n': 300, 'audited': {'tk': 112, 'get': 44, 'data': 26, "
                                               "'name': 19, 'format': 12, 'class': 8, 'write': 8, 'file': 6, 'default': 6, 'create': 6, 'compile': 5, 'text': 5, 'raw': 5, 'parse': 4, 'add': 3, 'me': "
                                               "3, 'distribution': 3, 'max': 3, 'size': 3, 'option': 3, 'encoding': 2, 'set': 2, 'headers': 2, 'command': 2, 'read': 2, 'find': 2, 're': 2, "
                                               "'configure': 2}, 'reference': {'tk': 115, 'get': 41, 'data': 24, 'name': 15, 'format': 12, 'size': 8, 'raw': 8, 'create': 8, 'configure': 7, 'write': "
                                               "7, 'class': 5, 'set': 5, 'headers': 4, 'option': 4, 'encoding': 4, 'command': 4, 'max': 4, 'find': 4, 'add': 3, 'me': 3, 'default': 3, 'compile': 3, "
                                               "'parse': 3, 'read': 2, 're': 2, 'distribution': 1, 'text': 1}}]})\n"
                                               "('exact', None)",
                                       'hidden': True,
                                       'locked': False},
                                   {   'code': ">>> audit_recording({'pair': 'hidden_3', 'cells': [{'prompt': 'In 1492,', 'setting': 't0.8,p0.6', 'fields': {'temperature': 0.8, 'top_p': 0.6}, "
                                               "'max_tokens': 1, 'n': 300, 'audited': {'\\n': 71, ' 0': 47, ' 2': 34, ' U': 30, '0': 30, ' 1': 22, ' 3': 16, ' (': 16, ' #': 15, ' and': 12, ' 4': 7}, "
                                               "'reference': {' 0': 71, '\\n': 54, ' 2': 31, ' U': 27, ' 1': 26, ' 3': 20, ' (': 16, '0': 16, ' 4': 14, ' and': 14, ' #': 11}}, {'prompt': '    return "
                                               "self.', 'setting': 't0.8,p0.6', 'fields': {'temperature': 0.8, 'top_p': 0.6}, 'max_tokens': 1, 'n': 300, 'audited': {'tk': 107, 'get': 47, 'data': 23, "
                                               "'name': 14, 'size': 9, 'max': 8, 'text': 7, 'raw': 7, 'compile': 7, 'parse': 6, 'format': 6, 'create': 6, 'add': 5, 'default': 5, 'file': 4, 'me': 4, "
                                               "'class': 4, 'find': 4, 'configure': 4, 'write': 4, 'encoding': 3, 'distribution': 3, 'option': 3, 'headers': 3, 're': 3, 'read': 2, 'set': 1, "
                                               "'command': 1}, 'reference': {'tk': 82, 'get': 45, 'data': 29, 'name': 17, 'raw': 12, 'format': 12, 'create': 10, 'configure': 9, 'write': 9, "
                                               "'compile': 8, 'encoding': 6, 'class': 6, 'max': 6, 'option': 5, 'file': 5, 'find': 4, 'distribution': 4, 'command': 4, 'read': 4, 'parse': 4, 'me': 3, "
                                               "'text': 3, 'default': 3, 'size': 2, 'set': 2, 'add': 2, 're': 2, 'headers': 2}}]})\n"
                                               "('exact', None)",
                                       'hidden': True,
                                       'locked': False},
                                   {   'code': ">>> audit_recording({'pair': 'hidden_4', 'cells': [{'prompt': 'In 1492,', 'setting': 't0.8,p0.6', 'fields': {'temperature': 0.8, 'top_p': 0.6}, "
                                               "'max_tokens': 2, 'n': 300, 'audited': {' 0\\n': 41, '\\n\\n': 37, ' UN': 16, ' 0 0': 15, ' 0 1': 15, '\\n 0': 13, ' 28': 10, '08': 9, '\\n 1': 9, "
                                               "'09': 9, ' 1\\n': 8, ' 20': 7, ' 29': 6, ' 24': 6, ' 1 1': 6, ' 26': 6, ' ##': 5, ' U+': 5, ' 44': 4, ' 1 0': 4, ' 23': 4, '05': 4, ' 32': 3, ' 21': "
                                               "3, ' and the': 3, '07': 3, '06': 2, ' # latin': 2, ' 43': 2, ' 31': 2, ' 34': 2, ' and not': 2, ' 48': 2, ' 30': 2, ' #2': 2, ' (0': 2, '0,': 2, ' "
                                               '(4\': 2, \' (12\': 1, \' and \\\\\': 1, " and \'": 1, \' # gre\': 1, \' and\\n   \': 1, \' #5\': 1, \' (max\': 1, \' # the\': 1, \' and (\': 1, \' '
                                               "40': 1, ' #1': 1, ' 33': 1, ' (+': 1, ' #4': 1, ' 41': 1, ' # N': 1, ' (3': 1, ' and b': 1, ' (c': 1, ' (10': 1, ' # it': 1, ' (8': 1, ' and 1': 1, ' "
                                               '(1\': 1, \' 27\': 1}, \'reference\': {\' 0x\': 67, \'\\n#\': 47, \' UN\': 23, "\\n \'": 13, \'08\': 11, \' U+\': 10, \' 19\': 8, \' 28\': 7, \'09\': '
                                               "7, '07': 5, ' (0': 5, ' (c': 4, ' 16': 4, ' 13': 4, ' 23': 4, '06': 4, ' 18': 4, ' (10': 3, ' 29': 3, ' ##': 3, ' 27': 3, ' 20': 3, ' 24': 3, ' 199': "
                                               "3, ' and not': 2, ' (3': 2, ' and 2': 2, ' 32': 2, ' 30': 2, ' (2': 2, ' 21': 2, ' 40': 2, ' (4': 2, ' (6': 2, ' 14': 2, ' 15': 2, ' 34': 1, ' and "
                                               "\\\\': 1, ' 38': 1, ' 110': 1, ' (tuple': 1, ' (max': 1, ' (8': 1, ' (which': 1, ' 43': 1, ' and -': 1, ' 33': 1, ' # gre': 1, '05': 1, ' "
                                               'and\\n           \': 1, \' and "\': 1, \' #5\': 1, \' 44\': 1, \'0,\': 1, \' 31\': 1, \' #3\': 1, \' 17\': 1, \' and a\': 1, \' # 2\': 1, \' (1\': 1, '
                                               "' 42': 1, ' and\\n   ': 1, ' 41': 1, ' and\\n       ': 1}}, {'prompt': '    return self.', 'setting': 't0.8,p0.6', 'fields': {'temperature': 0.8, "
                                               "'top_p': 0.6}, 'max_tokens': 2, 'n': 300, 'audited': {'tk.': 86, 'getget': 14, 'name\\n\\n   ': 12, 'dataget': 8, 'name ==': 6, 'datamax': 6, "
                                               "'configure(': 6, 'tkget': 5, 'default_': 5, 'format(': 5, 'text\\n\\n   ': 4, 'findget': 4, 'write_': 4, 'getheaders': 4, 'raw.': 4, 'add(': 4, "
                                               "'command.': 4, 'class(': 3, 'getdata': 3, 'option_': 3, 'headersget': 3, 'compile_': 3, 'rawsize': 3, 'distributionget': 3, 'data_': 2, 'maxget': 2, "
                                               "'getcopy': 2, 'write(': 2, 'compile(': 2, 'maxdata': 2, 'getmax': 2, 'tkheaders': 2, 'dataheaders': 2, 'defaultget': 2, 'meget': 2, 'maxheaders': 2, "
                                               "'size\\n\\n   ': 2, 'class_': 2, 'createget': 2, 'add_': 2, 'finddata': 2, 'gets': 2, 'getsize': 1, 'maxraw': 1, 'maxread': 1, 'text +': 1, "
                                               "'createbuffer': 1, 'datadistribution': 1, 'create_': 1, 'sizeb': 1, 'findlineno': 1, 'tkmax': 1, 'tkdata': 1, 'getlineno': 1, 'tktk': 1, 'readtk': 1, "
                                               "'size,': 1, 'distributionre': 1, 'create(': 1, 'rawget': 1, 'headerscur': 1, 'medata': 1, 'parsetk': 1, 'tkbuffer': 1, 'finds': 1, 'metk': 1, 'file_': "
                                               "1, 'databuffer': 1, 'distributions': 1, 'readraw': 1, 'mecurrent': 1, 'data\\n\\n   ': 1, 'findencoding': 1, 'distributionmax': 1, 'file.': 1, "
                                               "'datasplit': 1, 'findcopy': 1, 'maxmax': 1, 'datacompile': 1, 'getcreate': 1, 'createmax': 1, 'rawdistribution': 1, 'parsedata': 1, 'getscreen': 1, "
                                               "'findfind': 1, 'datatell': 1, 'headersmax': 1, 'parsecreate': 1, 'getstack': 1, 'parseget': 1, 'getme': 1, 'data.': 1, 'findme': 1, 'getparse': 1, "
                                               "'readget': 1, 'compileget': 1, 'findmax': 1, 'tkraw': 1, 'gettk': 1, 'distributioncreate': 1, 'maxtk': 1, 'datacur': 1, 'createcopy': 1, "
                                               "'encoding\\n       ': 1}, 'reference': {'tk.': 116, 'get_': 33, 'format(': 15, 'name ==': 12, 'raw.': 7, 'data\\n\\n   ': 7, 'data.': 7, 'name\\n\\n   "
                                               "': 7, 'create_': 6, 'option_': 5, 'distribution.': 5, 'find_': 5, 'write_': 5, 'configure(': 4, 'compile(': 4, 'write(': 4, 'data_': 3, 'set_': 3, "
                                               "'command.': 3, 'create(': 3, 'headers\\n\\n   ': 3, 'rawsize': 3, 'text\\n\\n   ': 2, 'size ==': 2, 'headers.': 2, 'maxsize': 2, 'class(': 2, 'size_': "
                                               "2, 'compile_': 2, 'memo': 2, 'maxline': 2, 'size,': 2, 're.': 2, 'add(': 2, 'size\\n\\n   ': 2, 'retry': 1, 'rawdata': 1, 'file\\n\\n   ': 1, "
                                               "'default_': 1, 'add_': 1, 'read_': 1, 'encoding,': 1, 'encoding\\n\\n   ': 1, 'max_': 1, 'rer': 1, 'rever': 1, 'text +': 1, 'maxlen': 1, 'parse_': "
                                               '1}}]})\n'
                                               "('broken', ('In 1492,', 't0.8,p0.6'))",
                                       'hidden': True,
                                       'locked': False}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
