#!/usr/bin/env bash
# The pipeline bubble measured on CPU threads (one core per stage) against the simulator's.
# Each run trains a 4-layer dim-256 model on Shakespeare bytes with pp 2; the executor times
# every rank's compute inside the schedule, and pp_bubble (in the log) is the ranks' mean idle
# share of it. The median over steps 3..8 is printed beside the simulated bubble (unit costs;
# the measured one reflects this model's real costs, and the time sends wait for a receiver), and
# beside the bubble the simulator predicts from the measured costs per micro-batch (pp_tf_ms,
# pp_tb_ms: a full backward when unsplit, pp_tw_ms).
# Usage: bash bench/pp_bubble.sh [DATA]   (from the repo root, after make build/train build/schedule)
set -u
DATA=${1:-../shared/data/tinyshakespeare.txt}
OUT=${OUT:-/tmp/pp_bubble}; mkdir -p "$OUT"
printf "| schedule | pp | m | measured bubble (median of steps 3-8) | simulated, tF=tB=tW | simulated with the measured tF, tB, tW (ms) |\n|---|---|---|---|---|---|\n"
for m in 4 8; do for s in afab 1f1b interleaved zb1 zbv dualpipev; do
    build/train --data "$DATA" --layers 4 --dim 256 --heads 4 --seq 128 --batch 4 --micro-batches $m --pp 2 --pp-schedule $s \
        --threads 1 --steps 8 --eval-every 0 --quiet --log "$OUT/$s$m.jsonl" > "$OUT/$s$m.txt" 2>&1 || { echo "| $s | 2 | $m | failed: $(tail -1 "$OUT/$s$m.txt") |"; continue; }
    sim=$(build/schedule --schedule $s --pp 2 --m $m | awk -F'|' -v s=$s '$2 ~ "^ *"s" *$" {gsub(/ /,"",$6); print $6; exit}')
    python3 - "$OUT/$s$m.jsonl" "$s" "$m" "$sim" <<'PY'
import json, sys, statistics, subprocess
rows = [json.loads(l) for l in open(sys.argv[1])][2:]
med = lambda k: statistics.median(r[k] for r in rows)
tf, tb, tw = med("pp_tf_ms"), med("pp_tb_ms"), med("pp_tw_ms")
out = subprocess.run(["build/schedule", "--schedule", sys.argv[2], "--pp", "2", "--m", sys.argv[3],
                      "--tf", "%g" % tf, "--tb", "%g" % tb, "--tw", "%g" % tw], capture_output=True, text=True).stdout
meas = next((l.split("|")[5].strip() for l in out.splitlines() if l.split("|")[1:2] and l.split("|")[1].strip() == sys.argv[2]), "?")
print("| %s | 2 | %s | %.1f%% | %s | %s (%.0f, %.0f, %.0f) |" % (sys.argv[2], sys.argv[3], 100 * med("pp_bubble"), sys.argv[4], meas, tf, tb, tw))
PY
done; done
