#!/usr/bin/env bash
# test_plan_cli.sh — the planner CLI (examples/plan.c) from the outside: --help, errors as one
# sentence with exit 2, the 1B-on-8-GPUs answer, the TSV, and that every command it emits is
# accepted by the trainer: a tiny model planned for 2 GPUs, each emitted train_cuda line run for
# one step by the CPU trainer (the same flags; --nproc W becomes --dp W/(tp·cp·pp), threads; the
# task's exact match after the step decodes one batch of problems, not 200).
#   bash tests/test_plan_cli.sh build/plan build/train
set -u
BIN=${1:-build/plan}; TRAIN=${2:-build/train}
PASS=0; FAIL=0
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
check() { if [ "$2" -eq 0 ]; then PASS=$((PASS + 1)); echo "  ok   $1"; else FAIL=$((FAIL + 1)); echo "  FAIL $1"; fi; }
run() { "$BIN" "$@" >"$TMP/out" 2>"$TMP/err"; RC=$?; OUT=$(cat "$TMP/out"); ERR=$(cat "$TMP/err"); }
one_sentence() { [ "$RC" -eq 2 ] && [ -z "$OUT" ] && [ "$(wc -l < "$TMP/err")" -eq 1 ]; }

run --help
check "--help exits 0 with usage" $([ "$RC" -eq 0 ] && [[ "$OUT" == usage:* ]]; echo $?)
run --bogus
check "unknown flag: one sentence, exit 2 ($ERR)" $(one_sentence && [[ "$ERR" == *"unknown flag"* ]]; echo $?)
run --model llama-9b
check "unknown model: one sentence, exit 2 ($ERR)" $(one_sentence && [[ "$ERR" == *"unknown --model"* ]]; echo $?)
run --nodes 0
check "--nodes 0: one sentence, exit 2 ($ERR)" $(one_sentence; echo $?)
run --seq
check "missing value: one sentence, exit 2 ($ERR)" $(one_sentence && [[ "$ERR" == *"missing value"* ]]; echo $?)
run --svg x.svg
check "--svg without --sweep: one sentence, exit 2 ($ERR)" $(one_sentence; echo $?)
run --global-batch 1000
check "a global batch not of whole sequences: one sentence, exit 2 ($ERR)" $(one_sentence && [[ "$ERR" == *"multiple of seq"* ]]; echo $?)
printf 'ultrascale-rates 1\ngemm_tflops = fast\n' > "$TMP/r.txt"
run --rates "$TMP/r.txt"
check "a bad rates file: one sentence, exit 2 ($ERR)" $(one_sentence && [[ "$ERR" == *"line 2"* ]]; echo $?)
run --rates "$TMP/none.txt"
check "a missing rates file: one sentence, exit 2 ($ERR)" $(one_sentence; echo $?)

run --model llama-1b --top 3 --random 2 --tsv "$TMP/p.tsv"
check "llama-1b on 8 GPUs: exit 0" $([ "$RC" -eq 0 ]; echo $?)
check "llama-1b on 8 GPUs: the best is pure data parallel" $(grep -m1 '^top     1' "$TMP/out" | grep -q 'dp8 tp1 pp1 cp1'; echo $?)
check "the best's command: --nproc 8, a 256-sequence global batch" $(sed -n 's/.*\(build\/train_cuda.*\)/\1/p' "$TMP/out" | head -1 | awk '{for(i=1;i<=NF;i++){if($i=="--batch")b=$(i+1);if($i=="--grad-accum")g=$(i+1);if($i=="--nproc")n=$(i+1)}} END{exit !(b*g==256 && n==8)}'; echo $?)
check "why the best wins is printed" $(grep -q '^why the best wins' "$TMP/out"; echo $?)
check "the TSV has the 3 top and 2 random lines" $([ "$(grep -c '^top' "$TMP/p.tsv")" -eq 3 ] && [ "$(grep -c '^random' "$TMP/p.tsv")" -eq 2 ]; echo $?)
run --model llama-70b
check "llama-70b on 8 x 80 GB: no configuration fits, exit 1" $([ "$RC" -eq 1 ] && [[ "$OUT" == *"no configuration fits"* ]]; echo $?)

# every emitted command is a valid trainer command line
run --layers 2 --dim 64 --heads 4 --kv-heads 2 --ffn 128 --vocab 256 --seq 64 --global-batch 1024 --gpus-per-node 2 --top 3 --random 12 --seed 3 --tsv "$TMP/tiny.tsv"
check "tiny model on 2 GPUs: exit 0" $([ "$RC" -eq 0 ]; echo $?)
n=0; bad=0
while IFS=$'\t' read -r kind rank pred mem cmd; do
    n=$((n + 1))
    set -- $cmd; shift
    args=(); tp=1; cp=1; pp=1; w=1
    while [ $# -gt 0 ]; do
        case "$1" in
            --nproc) w=$2; shift 2; continue;;
            --tp) tp=$2;; --cp) cp=$2;; --pp) pp=$2;;
        esac
        args+=("$1"); shift
    done
    "$TRAIN" "${args[@]}" --dp $((w / (tp * cp * pp))) --steps 1 --quiet --eval-every 0 --threads 1 --exact-match 16 > "$TMP/t.txt" 2>&1 || { bad=$((bad + 1)); echo "     rejected: ${args[*]}: $(tail -1 "$TMP/t.txt")"; }
done < "$TMP/tiny.tsv"
check "all $n emitted commands run one step on the CPU trainer ($bad failed)" $([ "$n" -eq 15 ] && [ "$bad" -eq 0 ]; echo $?)
echo "test_plan_cli: $PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
