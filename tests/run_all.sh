#!/usr/bin/env bash
# Runs every test step given as "name::command", sums the "N passed, N failed[, N skipped]"
# lines they print (a step that prints none counts as one pass or one failure by exit code),
# and ends with one summary line. Exit status is non-zero on any failure.
set -u
pass=0; fail=0; skip=0
for step in "$@"; do
    name=${step%%::*}; cmd=${step#*::}
    out=$(bash -c "$cmd" 2>&1); rc=$?
    line=$(printf '%s\n' "$out" | grep -E '[0-9]+ passed, [0-9]+ failed' | tail -n 1)
    if [ -n "$line" ]; then
        p=$(sed -E 's/.* ([0-9]+) passed.*/\1/' <<<"$line"); f=$(sed -E 's/.* ([0-9]+) failed.*/\1/' <<<"$line")
        s=0; if grep -q skipped <<<"$line"; then s=$(sed -E 's/.* ([0-9]+) skipped.*/\1/' <<<"$line"); fi
        if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    elif grep -q '^SKIP' <<<"$out"; then p=0; f=0; s=1
    elif [ "$rc" -eq 0 ]; then p=1; f=0; s=0
    else p=0; f=1; s=0
    fi
    pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
    if [ "$f" -gt 0 ]; then
        printf 'FAIL %-28s %s\n' "$name" "${line:-exit $rc}"
        printf '%s\n' "$out" | grep -E 'FAIL|error|Error|ERROR|runtime error' | head -n 20 | sed 's/^/     /'
    elif [ "$s" -gt 0 ] && [ "$p" -eq 0 ]; then printf 'skip %-28s %s\n' "$name" "$(printf '%s\n' "$out" | grep '^SKIP' | head -n 1)"
    else printf 'ok   %-28s %s\n' "$name" "${line:-}"
    fi
done
if [ "$skip" -gt 0 ]; then echo "$pass passed, $fail failed, $skip skipped"; else echo "$pass passed, $fail failed"; fi
[ "$fail" -eq 0 ]
