#!/usr/bin/env bash
# The pipeline bubble measured on CPU threads (one core per stage) against the simulator's.
# Each run trains a 4-layer dim-256 model on Shakespeare bytes with pp 2; the executor times
# every rank's compute inside the schedule, and pp_bubble (in the log) is the ranks' mean idle
# share of it. Medians over steps 3..8, for both ways messages travel (// >>pp in ultrascale.h):
# on channels, sent as they are ready (the threads backend's default), and on the schedule's
# unit-cost clock (--pp-clock, the plan NCCL runs). Beside them the simulator's bubble with unit
# costs, and with the costs measured in the channel run (pp_tf_ms, pp_tb_ms — a full backward
# when unsplit — and pp_tw_ms, per micro-batch and rank).
# NCCL=1 runs both plans under the threads backend's NCCL semantics (--nccl-semantics: every wait
# synchronises the rank's calls, as a GPU's implicit synchronisations do); MS="8" picks the m's,
# SCHEDULES="1f1b dualpipe" the schedules.
# Usage: bash bench/pp_bubble.sh [DATA]   (from the repo root, after make build/train build/schedule)
set -u
DATA=${1:-../shared/data/tinyshakespeare.txt}
OUT=${OUT:-/tmp/pp_bubble}; mkdir -p "$OUT"
MS=${MS:-4 8}
SEM=""; [ "${NCCL:-0}" = 1 ] && SEM="--nccl-semantics"
printf "| schedule | m | measured, channels | measured, clock | simulated, tF=tB=tW | simulated with the measured tF, tB, tW (ms) |\n|---|---|---|---|---|---|\n"
for m in $MS; do for s in ${SCHEDULES:-afab 1f1b interleaved zb1 zbv dualpipev dualpipe}; do
    for plan in chan clock; do
        flag=""; [ $plan = clock ] && flag="--pp-clock"
        build/train --data "$DATA" --layers 4 --dim 256 --heads 4 --seq 128 --batch 4 --micro-batches $m --pp 2 --pp-schedule $s $flag $SEM \
            --threads 1 --steps 8 --eval-every 0 --quiet --log "$OUT/$s$m$plan.jsonl" > "$OUT/$s$m$plan.txt" 2>&1 || echo "failed: $s $m $plan: $(tail -1 "$OUT/$s$m$plan.txt")"
    done
    sim=$(build/schedule --schedule $s --pp 2 --m $m | awk -F'|' -v s=$s '$2 ~ "^ *"s" *$" {gsub(/ /,"",$6); print $6; exit}')
    python3 - "$OUT/$s${m}chan.jsonl" "$OUT/$s${m}clock.jsonl" "$s" "$m" "$sim" <<'PY'
import json, sys, statistics, subprocess
def rows(f):
    try: return [json.loads(l) for l in open(f)][2:]
    except OSError: return []
ch, cl = rows(sys.argv[1]), rows(sys.argv[2])
med = lambda r, k: statistics.median(x[k] for x in r) if r else float("nan")
tf, tb, tw = med(ch, "pp_tf_ms"), med(ch, "pp_tb_ms"), med(ch, "pp_tw_ms")
out = subprocess.run(["build/schedule", "--schedule", sys.argv[3], "--pp", "2", "--m", sys.argv[4],
                      "--tf", "%g" % tf, "--tb", "%g" % tb, "--tw", "%g" % tw], capture_output=True, text=True).stdout
meas = next((l.split("|")[5].strip() for l in out.splitlines() if l.split("|")[1:2] and l.split("|")[1].strip() == sys.argv[3]), "?")
print("| %s | %s | %.1f%% | %.1f%% | %s | %s (%.0f, %.0f, %.0f) |" % (sys.argv[3], sys.argv[4], 100 * med(ch, "pp_bubble"),
      100 * med(cl, "pp_bubble"), sys.argv[5], meas, tf, tb, tw))
PY
done; done
