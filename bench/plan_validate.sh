#!/usr/bin/env bash
# The planner against measured runs on this machine (1 and 2 H200s), ≤ 8 minutes:
#   for a Llama-3.2-1B-shaped model at seq 2048 and 32 sequences per step, build/plan ranks every
#   valid configuration; its top 5 and 5 random valid ones (per GPU count) run through
#   build/train_cuda for a few steps; the table prints predicted vs measured tokens/s (median of
#   steps 3..) and peak memory (the backend's mem_bytes), the Spearman rank correlation of
#   throughput and the memory error.
# Needs: make build/plan build/train_cuda (and, for measured rates, build/calibrate run first:
#   build/calibrate --out bench/rates_h200.txt). Logs go to $OUT (default /tmp/plan_validate).
#   GPUS (default "1 2") picks the GPU counts; STEPS (6) and RUN_TIMEOUT (60 s) bound each run.
set -u
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/plan_validate}; mkdir -p "$OUT"
STEPS=${STEPS:-6}
RATES=${RATES:-bench/rates_h200.txt}
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
MODEL="--model llama-1b --seq 2048 --global-batch 65536 --gpu-mem 139 --max-micro-batch 16"
[ -f "$RATES" ] && MODEL="$MODEL --rates $RATES"
for g in ${GPUS:-1 2}; do
    [ "$g" -gt "$ngpu" ] && { echo "skip $g GPUs: this machine has $ngpu"; continue; }
    build/plan $MODEL --gpus-per-node $g --top 5 --random 5 --seed 7 --tsv "$OUT/plan_$g.tsv" > "$OUT/plan_$g.txt" 2>&1 || { echo "plan failed: $(tail -1 "$OUT/plan_$g.txt")"; continue; }
    i=0
    while IFS=$'\t' read -r kind rank pred mem cmd; do
        i=$((i + 1))
        timeout ${RUN_TIMEOUT:-60} $cmd --steps $STEPS --eval-every 0 --quiet --log "$OUT/run_${g}_$i.jsonl" > "$OUT/run_${g}_$i.txt" 2>&1
        echo "$g	$kind	$rank	$pred	$mem	$OUT/run_${g}_$i.jsonl	$cmd" >> "$OUT/runs.tsv"
    done < "$OUT/plan_$g.tsv"
done
python3 - "$OUT/runs.tsv" <<'PY'
import json, sys, statistics, os
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])] if os.path.exists(sys.argv[1]) else []
def rank(v):
    o = sorted(range(len(v)), key=lambda i: v[i]); r = [0.0] * len(v); i = 0
    while i < len(o):
        j = i
        while j + 1 < len(o) and v[o[j + 1]] == v[o[i]]: j += 1
        for k in range(i, j + 1): r[o[k]] = (i + j) / 2.0
        i = j + 1
    return r
def spearman(a, b):
    ra, rb = rank(a), rank(b); ma, mb = statistics.mean(ra), statistics.mean(rb)
    num = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    den = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return num / den if den else float("nan")
for g in ("1", "2"):
    sel = [r for r in rows if r[0] == g]
    if not sel: continue
    print("\n%s GPU(s): predicted vs measured" % g)
    print("| kind | # | configuration | predicted tok/s | measured tok/s | predicted GiB | measured GiB | memory error |")
    print("|---|---|---|---|---|---|---|---|")
    P, M, errs = [], [], []
    for r in sel:
        g_, kind, rk, pred, mem, log, cmd = r
        cfg = " ".join(cmd.split()[cmd.split().index("--batch"):])
        try:
            s = [json.loads(l) for l in open(log)]
            tok = statistics.median(x["tok_s"] for x in s[2:]) if len(s) > 2 else float("nan")
            mm = max(x["mem_bytes"] for x in s) / 2**30
        except Exception:
            print("| %s | %s | %s | %.0f | failed | %.2f | | |" % (kind, rk, cfg, float(pred), float(mem) / 2**30)); continue
        e = mm / (float(mem) / 2**30) - 1
        P.append(float(pred)); M.append(tok); errs.append(abs(e))
        print("| %s | %s | %s | %.0f | %.0f | %.2f | %.2f | %+.1f%% |" % (kind, rk, cfg, float(pred), tok, float(mem) / 2**30, mm, 100 * e))
    if len(P) >= 3:
        print("%s GPU(s): Spearman rank correlation of throughput %.3f over %d runs (goal >= 0.8); memory error max %.1f%%, mean %.1f%% (goal <= 5%%)" %
              (g, spearman(P, M), len(P), 100 * max(errs), 100 * statistics.mean(errs)))
PY
