#!/usr/bin/env bash
# test_memory_cli.sh — checks the memory estimator CLI (examples/memory.c) from the outside:
# exit codes, the presets, the Llama-3.1-8B parameter count, the SVG chart and the errors.
#   bash tests/test_memory_cli.sh build/memory
set -u

BIN=${1:-build/memory}
PASS=0
FAIL=0
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

check() {   # check NAME CONDITION-EXIT-CODE
    if [ "$2" -eq 0 ]; then PASS=$((PASS + 1)); echo "  ok   $1"
    else FAIL=$((FAIL + 1)); echo "  FAIL $1"; fi
}

# run ARGS...: sets RC, OUT (stdout) and ERR (stderr)
run() {
    "$BIN" "$@" >"$TMP/out" 2>"$TMP/err"
    RC=$?
    OUT=$(cat "$TMP/out")
    ERR=$(cat "$TMP/err")
}

# bytes_of ROW: the byte count (the first all-digits-and-commas field) of that table row
bytes_of() {
    grep "^  $1 " "$TMP/out" | awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^[0-9,]+$/) { gsub(",", "", $i); print $i; exit } }'
}

if [ ! -x "$BIN" ]; then
    echo "  FAIL $BIN is not an executable (build it first)"
    echo "test_memory_cli: 0 passed, 1 failed"
    exit 1
fi

run --help
check "--help exits 0 and prints usage" $([ "$RC" -eq 0 ] && [[ "$OUT" == usage:* ]]; echo $?)

for m in tiny llama-1b llama-8b llama-70b; do
    run --model "$m"
    check "--model $m runs and prints a total" $([ "$RC" -eq 0 ] && grep -q '^  total ' "$TMP/out"; echo $?)
done

# Llama-3.1-8B has 8,030,261,248 parameters
run --model llama-8b --precision bf16
params=$(bytes_of parameters)
check "llama-8b bf16 parameter count ${params:-?} within 1% of 8.03e9" \
    $(awk -v p="${params:-0}" 'BEGIN { d = p / 8.03e9 - 1; exit !(d < 0.01 && d > -0.01) }'; echo $?)

# fp16 (the trainer's --precision fp16) takes what bf16 takes, labelled fp16
run --model llama-8b --precision fp16
fp16=$(bytes_of total)
run --model llama-8b --precision bf16
bf16=$(bytes_of total)
check "--precision fp16 runs, fp16 params, the bytes of bf16 (${fp16:-?} = ${bf16:-?})" \
    $([ "$RC" -eq 0 ] && [ -n "$fp16" ] && [ "$fp16" = "$bf16" ] && "$BIN" --model llama-8b --precision fp16 | grep -q 'params (fp16)'; echo $?)

run --model llama-8b --recompute full --batch 2
full=$(bytes_of activations)
run --model llama-8b --recompute none --batch 2
none=$(bytes_of activations)
check "full recompute keeps fewer activation bytes than none (${full:-?} < ${none:-?})" \
    $(awk -v a="${full:-0}" -v b="${none:-0}" 'BEGIN { exit !(a > 0 && a < b) }'; echo $?)

svg="$TMP/memory.svg"
run --model llama-1b --svg "$svg"
check "--svg writes a file that starts with <svg and contains </svg>" \
    $([ "$RC" -eq 0 ] && [ -s "$svg" ] && head -c 4 "$svg" | grep -q '^<svg' && grep -q '</svg>' "$svg"; echo $?)
check "the chart has one total label per default sequence length (5)" \
    $([ "$(grep -c 'font-weight="bold" fill="#222">[0-9]' "$svg")" -eq 5 ]; echo $?)

run --model tiny --seqs 64,128 --svg "$TMP/two.svg"
check "--seqs 64,128 draws two bars" \
    $([ "$RC" -eq 0 ] && [ "$(grep -c 'font-weight="bold" fill="#222">[0-9]' "$TMP/two.svg")" -eq 2 ]; echo $?)

run --model tiny --svg "$TMP/no/such/dir/x.svg"
check "unwritable --svg path exits 1 with a message" $([ "$RC" -eq 1 ] && [[ "$ERR" == memory:*cannot\ write* ]]; echo $?)

run --bogus
check "unknown flag exits 2 with 'memory: ...' and usage" \
    $([ "$RC" -eq 2 ] && [[ "$ERR" == memory:\ unknown\ flag* ]] && grep -q '^usage:' "$TMP/err"; echo $?)

run --model llama-2b
check "unknown preset exits 2" $([ "$RC" -eq 2 ] && [[ "$ERR" == memory:* ]]; echo $?)

run --heads 3 --dim 64
check "--heads 3 --dim 64 exits 2 with the validation sentence" \
    $([ "$RC" -eq 2 ] && grep -q 'not divisible by heads=3' "$TMP/err"; echo $?)

run --seq abc
check "--seq abc exits 2" $([ "$RC" -eq 2 ] && [[ "$ERR" == memory:\ bad\ value* ]]; echo $?)

for bad in "--seq 0" "--seq 12x" "--batch -1" "--layers 1e3" "--precision fp12" "--recompute some" "--seqs 1024,,2048" "--seq"; do
    # shellcheck disable=SC2086
    run $bad
    check "'$bad' exits 2" $([ "$RC" -eq 2 ]; echo $?)
done

# B*T*V passes the library's check, but B*T*F*L bytes would pass 2^64
run --model llama-8b --vocab 2 --batch 16777216 --seq 16777216
check "an overflowing configuration is refused, exit 2" $([ "$RC" -eq 2 ] && [[ "$ERR" == memory:* ]]; echo $?)

# parallelism: the rank's share shrinks stage by stage, and bad sizes are refused
total() { "$BIN" --model llama-8b "$@" | awk '/^  total/ { gsub(",", "", $2); print $2 }'; }
t0=$(total); t1=$(total --dp 8 --zero 1); t2=$(total --dp 8 --zero 2); t3=$(total --dp 8 --zero 3); tt=$(total --tp 8 --sp)
check "ZeRO-1/2/3 over 8 ranks: each stage smaller ($t0 > $t1 > $t2 > $t3)" $([ "$t0" -gt "$t1" ] && [ "$t1" -gt "$t2" ] && [ "$t2" -gt "$t3" ]; echo $?)
check "tp 8 + sp: under a fifth of one rank ($tt)" $([ $((tt * 5)) -lt "$t0" ]; echo $?)
run --tp 3
check "--tp 3 with 4 heads exits 2 naming them" $([ "$RC" -eq 2 ] && [[ "$ERR" == *"heads=4"* ]]; echo $?)
run --zero 4
check "--zero 4 exits 2" $([ "$RC" -eq 2 ]; echo $?)

# mixture of experts: Mixtral-8x7B's published 46.7 B total and 12.9 B active parameters
run --model mixtral-8x7b
check "mixtral-8x7b: 46,702,792,704 parameters, 12,879,925,248 active per token" \
    $([ "$RC" -eq 0 ] && [[ "$OUT" == *"46,702,792,704"* ]] && [[ "$OUT" == *"12,879,925,248"* ]]; echo $?)
run --experts 4 --top-k 5
check "--experts 4 --top-k 5 exits 2 in one sentence" $([ "$RC" -eq 2 ] && [[ "$ERR" == *"top-k=5 must be in 1..experts=4"* ]]; echo $?)
# --measure: two real steps here; the allocator's count equals the estimate, and the process's
# resident peak holds at least what the library allocated (training touches every buffer)
run --layers 2 --dim 128 --heads 4 --vocab 512 --seq 128 --batch 8 --measure
est=$(grep "^  estimate " "$TMP/out" | awk '{print $2}')
alloc=$(grep "^  allocator peak " "$TMP/out" | awk '{print $3}')
rss=$(grep "^  process peak RSS " "$TMP/out" | awk '{print $4}')
check "--measure: estimate $est = allocator peak $alloc MiB <= process peak RSS $rss MiB" \
    $([ "$RC" -eq 0 ] && [ -n "$est" ] && [ "$est" = "$alloc" ] &&
      awk -v a="$alloc" -v r="$rss" 'BEGIN { exit !(r + 0 >= a + 0 && a + 0 > 0) }'; echo $?)
run --model llama-70b --measure
check "--measure refuses a model larger than half of this machine's memory" \
    $([ "$RC" -eq 2 ] && [[ "$ERR" == *"more than half of this machine"* ]]; echo $?)
run --dp 2 --measure
check "--measure --dp 2 exits 2: one rank only" $([ "$RC" -eq 2 ] && [[ "$ERR" == *"one rank"* ]]; echo $?)
echo "test_memory_cli: $PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
