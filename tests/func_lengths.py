#!/usr/bin/env python3
"""func_lengths.py FILE [FROM TO]: the lengths of the function definitions in FILE (or between the line
starting FROM and the next line starting TO), longest first, from the signature's first line to
the closing brace."""
import re, sys
text = open(sys.argv[1]).read()
lines = text.split('\n')
lo, hi = 0, len(lines)
if len(sys.argv) > 2:
    lo = next(i for i, l in enumerate(lines) if l.startswith(sys.argv[2]))
    hi = next((i for i, l in enumerate(lines) if i > lo and l.startswith(sys.argv[3])), len(lines))
# blank out comments, strings and character constants, keeping the line structure
code = re.sub(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'',
              lambda m: re.sub(r'[^\n]', ' ', m.group(0)), text, flags=re.S).split('\n')
out, depth, start, stmt = [], 0, None, ''
for i in range(lo, hi):
    l = code[i]
    if l.lstrip().startswith('#'):
        continue
    for ch in l:
        if depth == 0:
            if ch == '{':
                # a function if what came before the brace since the last ; or } is name(...)
                if re.search(r'[A-Za-z_]\w*\s*\([^;]*\)\s*$', stmt) and '=' not in stmt.split('(')[0]:
                    start = (i, re.findall(r'([A-Za-z_]\w*)\s*\(', stmt)[0])
                else:
                    start = None
                stmt = ''
                depth = 1
                continue
            stmt = '' if ch in ';}' else stmt + ch
            if ch != ' ' and stmt.strip() == ch:
                first = i
        else:
            depth += (ch == '{') - (ch == '}')
            if depth == 0 and start:
                out.append((i - first + 1, start[1], first + 1))
                start, stmt = None, ''
    if depth == 0:
        stmt += '\n'
out.sort(reverse=True)
for n, name, at in out[:10]:
    print('%5d  %s (line %d)' % (n, name, at))
print('%d functions, %d over 120 lines, the longest %d' % (len(out), sum(n > 120 for n, _, _ in out), out[0][0] if out else 0))
