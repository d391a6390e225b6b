#!/usr/bin/env bash
# Issue 13 — the 5D mesh on 8 GPUs (the nvidia-h200-x8 kind; with 4 GPUs the sections that fit).
# Not run yet: no session has been lent an 8-GPU machine. Run from the repo root after
#   make build/train_cuda build/comm_bw build/plan && cp <tinyshakespeare.txt> build/
# (and, for the planner's rates, build/calibrate --out bench/rates_h200.txt on that machine).
#   equiv    losses of four meshes against one GPU on the same global batch (bf16, 20 steps, a
#            6-layer dim-512 model on tinyshakespeare): dp2 x tp2 x pp2, dp2 x cp2 x tp2,
#            dp 8 with ep 2 (the MoE variant: ep folds over dp, so 4 replicas of 2-rank expert
#            groups: the Playbook's dp4 x ep2), tp2 x pp2 x cp2
#   comm     the comm seam against raw NCCL on 8 ranks (build/comm_bw --nproc 8)
#   scale    Llama-3.2-1B, T 4096, 4 sequences per GPU, pure DP on 1, 2, 4, 8 GPUs
#   plan     1B and an 8B-shaped Llama at the planner's best 8-GPU configuration against dp 8
#            with ZeRO-3, predicted (build/plan) and measured tokens/s and memory
# The same meshes run on CPU threads in `make test` (tests/test_pp.c, test_cp.c, test_ep.c,
# test_train_cli.sh: dp2 x pp2 x cp2 x tp2 on 16 threads).
# SECTIONS picks sections (default all); logs in $OUT (default /tmp/run_8gpu); a table last.
set -u
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/run_8gpu}; mkdir -p "$OUT"
DATA=${DATA:-build/tinyshakespeare.txt}
NG=$(nvidia-smi -L 2>/dev/null | wc -l)
TR="timeout -k 5 ${RUN_TIMEOUT:-300} build/train_cuda"
run() { case " ${SECTIONS:-equiv comm scale plan} " in *" $1 "*) return 0;; *) return 1;; esac; }
go() {   # go NAME ARGS...
    local name=$1; shift
    $TR "$@" --eval-every 0 --quiet --log "$OUT/$name.jsonl" > "$OUT/$name.txt" 2>&1
    echo "$name: exit $? | $*" >> "$OUT/runs.txt"
}
[ "$NG" -ge 8 ] || echo "run_8gpu.sh: $NG GPUs visible; the 8-GPU runs will fail (RESULTS need 8)"
if run equiv; then
    S="--data $DATA --layers 6 --dim 512 --heads 8 --kv-heads 4 --precision bf16 --steps 20 --lr 1e-3 --seq 1024"
    go eq_ref      $S --batch 8 --grad-accum 4
    go eq_dp_tp_pp $S --batch 8 --grad-accum 4 --nproc 8 --dp 2 --tp 2 --pp 2
    go eq_dp_cp_tp $S --batch 8 --grad-accum 4 --nproc 8 --dp 2 --cp 2 --tp 2
    go eq_tp_pp_cp $S --batch 8 --grad-accum 4 --nproc 8 --tp 2 --pp 2 --cp 2
    go eq_ref_moe  $S --batch 8 --grad-accum 4 --experts 8 --top-k 2 --tied
    go eq_dp_ep    $S --batch 8 --grad-accum 4 --experts 8 --top-k 2 --tied --nproc 8 --dp 8 --ep 2
fi
if run comm; then timeout -k 5 300 build/comm_bw --nproc 8 > "$OUT/comm_bw.txt" 2>&1; echo "comm_bw: exit $?" >> "$OUT/runs.txt"; fi
L1B="--data $DATA --layers 16 --dim 2048 --heads 32 --kv-heads 8 --ffn 8192 --vocab 128256 --tied --precision bf16 --steps 8 --lr 3e-4 --seq 4096"
if run scale; then
    go dp1 $L1B --batch 4
    for n in 2 4 8; do go dp$n $L1B --batch $((4 * n)) --nproc $n; done
fi
if run plan; then
    R=""; [ -f bench/rates_h200.txt ] && R="--rates bench/rates_h200.txt"
    for m in 1b 8b; do
        build/plan --model llama-$m --gpus-per-node 8 --gpu-mem 139 --seq 4096 --global-batch 262144 $R --top 1 --tsv "$OUT/plan_$m.tsv" > "$OUT/plan_$m.txt" 2>&1
        cmd=$(cut -f5 "$OUT/plan_$m.tsv" | head -1)
        [ -n "$cmd" ] && $cmd --data $DATA --steps 8 --eval-every 0 --quiet --log "$OUT/plan_best_$m.jsonl" > "$OUT/plan_best_$m.txt" 2>&1
        shape=$(echo "$cmd" | sed -e 's/.*train_cuda //' -e 's/ --batch.*//')
        $TR $shape --data $DATA --batch 8 --grad-accum 8 --nproc 8 --zero 3 --steps 8 --log "$OUT/plan_z3_$m.jsonl" > "$OUT/plan_z3_$m.txt" 2>&1
    done
fi
python3 - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import json, os, statistics, sys
out = sys.argv[1]
def rows(n):
    f = os.path.join(out, n + ".jsonl")
    return [json.loads(l) for l in open(f)] if os.path.exists(f) else []
for run, ref in (("eq_dp_tp_pp", "eq_ref"), ("eq_dp_cp_tp", "eq_ref"), ("eq_tp_pp_cp", "eq_ref"), ("eq_dp_ep", "eq_ref_moe")):
    a, b = rows(ref), rows(run)
    if len(a) != 20 or len(b) != 20: print("%-12s missing (see runs.txt)" % run); continue
    d = max(abs(x["loss"] - y["loss"]) / x["loss"] for x, y in zip(a, b))
    print("%-12s vs %-10s worst relative loss difference over 20 steps %.1e (final %.4f vs %.4f)" % (run, ref, d, b[-1]["loss"], a[-1]["loss"]))
t1 = rows("dp1")
for n in (1, 2, 4, 8):
    r = rows("dp%d" % n)
    if len(r) > 2 and len(t1) > 2:
        t = statistics.median(x["tok_s"] for x in r[2:]); t0 = statistics.median(x["tok_s"] for x in t1[2:])
        print("dp%-2d %10.0f tok/s  scaling efficiency %5.1f%%  MFU %.1f%%" % (n, t, 100 * t / (n * t0), 100 * statistics.median(x["mfu"] for x in r[2:])))
for m in ("1b", "8b"):
    for k in ("plan_best_", "plan_z3_"):
        r = rows(k + m)
        if len(r) > 2: print("%-14s %10.0f tok/s  MFU %.1f%%  %.1f GiB/GPU" % (k + m, statistics.median(x["tok_s"] for x in r[2:]), 100 * statistics.median(x["mfu"] for x in r[2:]), r[-1]["mem_bytes"] / 2**30))
    p = os.path.join(out, "plan_%s.tsv" % m)
    if os.path.exists(p):
        f = open(p).readline().split("\t")
        if len(f) >= 5: print("plan_%s predicted %s tok/s, %.1f GiB: %s" % (m, f[2], int(f[3]) / 2**30, f[4].strip()))
PY
