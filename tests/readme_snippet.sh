#!/usr/bin/env bash
# The README's "Using the library" code block equals the lines between the markers of
# examples/readme_snippet.c (less their 4-space indent), which make test builds as C and as C++.
set -u
python3 - README.md examples/readme_snippet.c <<'PY'
import sys
readme, src = open(sys.argv[1]).read(), open(sys.argv[2]).read()
begin, end = "    /* ---- README begin */\n", "    /* ---- README end */\n"
if begin not in src or end not in src:
    sys.exit("%s: the README begin/end markers are missing" % sys.argv[2])
lines = src[src.index(begin) + len(begin):src.index(end)].split("\n")
want = "\n".join(l[4:] if l.startswith("    ") else l for l in lines)
blocks = [b.split("```", 1)[0] for b in readme.split("```c\n")[1:]]
if want in blocks:
    print("the README's block equals %s (%d lines)" % (sys.argv[2], want.count("\n")))
    sys.exit(0)
print("FAIL the README has no ```c block equal to the lines between the markers of %s;" % sys.argv[2])
print("     copy them (less 4 spaces of indent) into the README, or the README's block into it")
sys.exit(1)
PY
