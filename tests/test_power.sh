#!/usr/bin/env bash
# test_power.sh — bench/power.py (the GPU's power and clock while a command runs) and the power
# table of bench/gpu_table.py, on this machine with a stand-in nvidia-smi that prints fixed
# samples: the busy ones chosen by utilization, the medians, the share at the power cap, the
# command's exit status passed through, bad arguments refused, and without nvidia-smi the command
# still runs.
#   bash tests/test_power.sh
set -u
PASS=0
FAIL=0
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

check() {   # check NAME CONDITION-EXIT-CODE
    if [ "$2" -eq 0 ]; then PASS=$((PASS + 1)); echo "  ok   $1"
    else FAIL=$((FAIL + 1)); echo "  FAIL $1"; fi
}

# The stand-in: a query answers once; -lms prints four samples a round (three busy at 600, 700
# and 800 W, two of them at the software power cap; one idle at 80 W), until it is stopped.
mkdir -p "$TMP/bin"
cat > "$TMP/bin/nvidia-smi" <<'EOF'
#!/usr/bin/env bash
case "$*" in
*-lms*) while true; do
    echo "2026/12/04 04:15:38.048, 600.0, 1500, 100, 0x0000000000000004, 700.00, 1980"
    echo "2026/12/04 04:15:38.058, 700.0, 1600, 99, 0x0000000000000004, 700.00, 1980"
    echo "2026/12/04 04:15:38.068, 800.0, 1700, 97, 0x0000000000000000, 700.00, 1980"
    echo "2026/12/04 04:15:38.078, 80.0, 345, 0, 0x0000000000000001, 700.00, 1980"
    sleep 0.01
  done ;;
*) echo "2026/12/04 04:15:38.048, 80.0, 345, 0, 0x0000000000000001, 700.00, 1980" ;;
esac
EOF
chmod +x "$TMP/bin/nvidia-smi"
P="python3 bench/power.py"

OUT=$(PATH="$TMP/bin:$PATH" $P --log "$TMP/s.csv" -- sh -c 'echo from-the-command; sleep 0.2')
RC=$?
LINE=$(echo "$OUT" | grep '^power |')
check "the command runs and its output passes through (rc $RC)" \
    $([ "$RC" -eq 0 ] && echo "$OUT" | grep -q '^from-the-command$'; echo $?)
WANT='board 700 W median (p10 600, p90 800; limit 700.00 W) | software power cap 67 % of them'
WANT="$WANT | SM clock 1600 MHz median (1500-1700; max 1980)"
check "busy samples only: median 700 W, p10 600, p90 800, two thirds at the cap, clock 1600 MHz" \
    $(echo "$LINE" | grep -qF "$WANT"; echo $?)
N=$(grep -c . "$TMP/s.csv")
B=$(echo "$LINE" | sed -n 's/^power | \([0-9]*\) busy samples of \([0-9]*\) .*/\1 \2/p')
check "--log keeps every sample; three busy in four ($B of $N)" \
    $([ -n "$B" ] && set -- $B && [ "$2" -eq "$N" ] && [ $((4 * $1)) -ge $((3 * $2 - 3)) ] &&
      [ $((4 * $1)) -le $((3 * $2 + 3)) ]; echo $?)

PATH="$TMP/bin:$PATH" $P -- sh -c 'exit 3' > /dev/null
check "the command's exit status comes back (3)" $([ $? -eq 3 ]; echo $?)
for bad in "--every 0 -- true" "--every x -- true" "--bogus -- true" "--" "true"; do
    ERR=$(PATH="$TMP/bin:$PATH" $P $bad 2>&1 >/dev/null)
    RC=$?
    check "refused with one sentence and status 2: power.py $bad" \
        $([ "$RC" -eq 2 ] && echo "$ERR" | grep -q '^power.py: '; echo $?)
done
OUT=$($P --smi "$TMP/none/nvidia-smi" -- sh -c 'echo ran; exit 4' 2>"$TMP/err")
RC=$?
check "no nvidia-smi: the command still runs (status 4 back), the line and one sentence say so" \
    $([ "$RC" -eq 4 ] && echo "$OUT" | grep -q '^ran$' &&
      echo "$OUT" | grep -q '^power | not measured: .*nvidia-smi cannot be run' &&
      [ "$(wc -l < "$TMP/err")" -eq 1 ]; echo $?)

# the table: energy a token = board W / tokens/s
mkdir -p "$TMP/logs"
US='ultrascale   | 1b   | tok/s    65000 | MFU  59.5% | step   252.1 ms | peak   40.9 GiB'
printf '%s\n%s\n' "$US" "$LINE" > "$TMP/logs/us_1b.txt"
printf 'torch compile | 1b | tok/s 62000 | MFU 56.5%% | step 264.5 ms | peak 41.2 GiB\n' \
    > "$TMP/logs/torch_compile_1b.txt"
T=$(python3 bench/gpu_table.py "$TMP/logs")
ROW='1b    us             |  700 W | cap  67 % |  1600 MHz |  10.77 mJ/token'
check "gpu_table: the power row of a run with a power line, 700 W / 65000 tok/s = 10.77 mJ/token" \
    $(echo "$T" | grep -qxF "$ROW"; echo $?)
check "gpu_table: no power row for a run without one" \
    $(! echo "$T" | grep -q 'torch_compile  |'; echo $?)

echo "test_power: $PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
