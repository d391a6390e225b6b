#!/usr/bin/env bash
# The pipeline bubble measured on CPU threads (one core per stage) against the simulator's.
# Each run trains a 4-layer dim-256 model on Shakespeare bytes with pp 2; the executor times
# every rank's compute inside the schedule, and pp_bubble (in the log) is the ranks' mean idle
# share of it. The median over steps 3..8 is printed beside the simulated bubble (unit costs;
# the measured one reflects this model's real costs, and the time sends wait for a receiver).
# Usage: bash bench/pp_bubble.sh [DATA]   (from the repo root, after make build/train build/schedule)
set -u
DATA=${1:-../shared/data/tinyshakespeare.txt}
OUT=${OUT:-/tmp/pp_bubble}; mkdir -p "$OUT"
printf "| schedule | pp | m | measured bubble (median of steps 3-8) | simulated, tF=tB=tW |\n|---|---|---|---|---|\n"
for m in 4 8; do for s in afab 1f1b interleaved zb1 zbv dualpipev; do
    build/train --data "$DATA" --layers 4 --dim 256 --heads 4 --seq 128 --batch 4 --micro-batches $m --pp 2 --pp-schedule $s \
        --threads 1 --steps 8 --eval-every 0 --quiet --log "$OUT/$s$m.jsonl" > "$OUT/$s$m.txt" 2>&1 || { echo "| $s | 2 | $m | failed: $(tail -1 "$OUT/$s$m.txt") |"; continue; }
    sim=$(build/schedule --schedule $s --pp 2 --m $m | awk -F'|' -v s=$s '$2 ~ "^ *"s" *$" {gsub(/ /,"",$6); print $6; exit}')
    python3 - "$OUT/$s$m.jsonl" "$s" "$m" "$sim" <<'PY'
import json, sys, statistics
r = [json.loads(l)["pp_bubble"] for l in open(sys.argv[1])][2:]
print("| %s | 2 | %s | %.1f%% | %s |" % (sys.argv[2], sys.argv[3], 100 * statistics.median(r), sys.argv[4]))
PY
done; done
