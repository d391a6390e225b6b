#!/usr/bin/env bash
# Scaling efficiency on 2 H200s against one (issue 9), run from the repo root on the
# nvidia-h200-x2 machine with build/train_cuda, build/comm_bw and build/tinyshakespeare.txt built
# here (make build/train_cuda build/comm_bw; cp <tinyshakespeare.txt> build/).
#   comm    the comm seam's bus bandwidth against raw NCCL, 1 MB - 1 GB (build/comm_bw)
#   dp      Llama-3.2-1B shape, T 4096, 4 sequences per GPU: one GPU, dp 2, dp 2 with the
#           embedding's gradient reduced whole at the end (--dense-emb-grad), dp 2 + ZeRO-1, + ZeRO-3
#   ctas    dp 2 with NCCL's thread blocks capped (NCCL_MAX_CTAS in CTAS, default "4 8")
#   tp      tp 2 + sp on 8 sequences (each rank does one GPU's work of 4 sequences), overlapped
#           (the default) and serial (--tp-no-overlap)
#   pp      untied 1B, 16 micro-batches of one sequence: one GPU accumulating, pp 2 1F1B with the
#           default (FLOP-balanced) split, the even split 8,8, and 9,7
#   cp      1B at T 32768, one sequence, selective recompute: one GPU, cp 2 zig-zag
#   tpsms   tp 2 + sp with --overlap-sms from SMS (default "8 32 -1")
#   tpx     tp 2 + sp with NCCL_MAX_CTAS=8 (NCCL_P2P_USE_CUDA_MEMCPY=1 was tried: it hung)
#   ep      1B with 8 fine-grained experts (top-2, ffn 2048) per layer, 2 sequences per GPU:
#           one GPU accumulating two micro-batches, ep 2 over dp 2; EP_BIAS sets --moe-bias-rate
#           for both (Shakespeare's bytes collapse the router at the default 1e-3); EP_RANDOM=1
#           trains both on uniformly random tokens instead; EP_CAP sets --capacity-factor (an
#           expert's rows capped at that many times the mean, the rest dropped: balanced compute)
#   ref2    the one-GPU dp reference again, last: how far the GPUs drifted during the call
# Every run writes a trace; bench/trace_stats.py says where its time goes. Efficiency is
# tokens/s on 2 GPUs over twice one GPU's (median of the steps after the first two).
# SECTIONS picks sections (default all); logs in $OUT (default /tmp/scale_gpu); a table last.
set -u
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/scale_gpu}; mkdir -p "$OUT"
T="timeout -k 5 ${RUN_TIMEOUT:-150} build/train_cuda"
DATA=${DATA:-build/tinyshakespeare.txt}
STEPS=${STEPS:-8}
run() { case " ${SECTIONS:-comm dp ctas tp tpx pp cp ep ref2} " in *" $1 "*) return 0;; *) return 1;; esac; }
L1B="--data $DATA --layers 16 --dim 2048 --heads 32 --kv-heads 8 --ffn 8192 --vocab 128256 --precision bf16 --eval-every 0 --quiet --steps $STEPS --lr 3e-4"
go() {   # go NAME ARGS... : one run, its log, its JSONL (and trace when 2 GPUs)
    local name=$1; shift
    local tr="--trace $OUT/$name.json"
    $T $L1B "$@" $tr --log "$OUT/$name.jsonl" > "$OUT/$name.txt" 2>&1
    echo "$name: exit $? | $(grep -m1 -E '^model:' "$OUT/$name.txt" | cut -c1-150)" >> "$OUT/runs.txt"
}
if run comm; then timeout -k 5 240 build/comm_bw --nproc 2 > "$OUT/comm_bw.txt" 2>&1; echo "comm_bw: exit $?" >> "$OUT/runs.txt"; fi
if run dp; then
    go ref_dp --seq 4096 --batch 4 --tied
    go dp2 --seq 4096 --batch 8 --nproc 2 --tied
    go dp2_dense --seq 4096 --batch 8 --nproc 2 --tied --dense-emb-grad   # the embedding reduced whole, last
    go dp2_z1 --seq 4096 --batch 8 --nproc 2 --zero 1 --tied
    go dp2_z3 --seq 4096 --batch 8 --nproc 2 --zero 3 --tied
fi
if run ctas; then   # NCCL's thread blocks take SMs from the backward it overlaps: cap them (NCCL_MAX_CTAS)
    [ -f "$OUT/ref_dp.jsonl" ] || go ref_dp --seq 4096 --batch 4 --tied
    for c in ${CTAS:-4 8}; do NCCL_MAX_CTAS=$c go dp2_ctas$c --seq 4096 --batch 8 --nproc 2 --tied; done
fi
if run tp; then
    [ -f "$OUT/ref_dp.jsonl" ] || go ref_dp --seq 4096 --batch 4 --tied
    go tp2_sp --seq 4096 --batch 8 --nproc 2 --tp 2 --sp --tied
    go tp2_sp_serial --seq 4096 --batch 8 --nproc 2 --tp 2 --sp --tied --tp-no-overlap   # every collective waited where issued
fi
if run pp; then
    go ref_pp --seq 4096 --batch 1 --grad-accum 16
    go pp2_1f1b --seq 4096 --batch 1 --grad-accum 16 --nproc 2 --pp 2 --pp-schedule 1f1b           # default split: FLOP-balanced (10,6)
    go pp2_1f1b_8_8 --seq 4096 --batch 1 --grad-accum 16 --nproc 2 --pp 2 --pp-schedule 1f1b --pp-layers 8,8
    go pp2_1f1b_9_7 --seq 4096 --batch 1 --grad-accum 16 --nproc 2 --pp 2 --pp-schedule 1f1b --pp-layers 9,7
fi
if run cp; then
    go ref_cp --seq 32768 --batch 1 --recompute selective --tied
    go cp2_zigzag --seq 32768 --batch 1 --nproc 2 --cp 2 --cp-mode zigzag --recompute selective --tied
fi
if run tpsms; then   # the SMs the GEMMs beside a travelling tp collective leave to it (default 16)
    [ -f "$OUT/ref_dp.jsonl" ] || go ref_dp --seq 4096 --batch 4 --tied
    for n in ${SMS:-8 32 -1}; do go tp2_sp_sms$n --seq 4096 --batch 8 --nproc 2 --tp 2 --sp --tied --overlap-sms $n; done
fi
if run tpx; then   # where TP's remaining time goes: NCCL's thread blocks capped; p2p through the copy engines
    [ -f "$OUT/ref_dp.jsonl" ] || go ref_dp --seq 4096 --batch 4 --tied
    NCCL_MAX_CTAS=8 go tp2_sp_ctas8 --seq 4096 --batch 8 --nproc 2 --tp 2 --sp --tied
fi
if run ep; then
    MOE="--experts 8 --top-k 2 --moe-ffn 2048 --tied ${EP_BIAS:+--moe-bias-rate $EP_BIAS} ${EP_CAP:+--capacity-factor $EP_CAP}"
    if [ -n "${EP_RANDOM:-}" ]; then   # uniformly random tokens: nothing for the router to collapse onto
        python3 -c "
import array, random, struct, sys
random.seed(1); n = 1 << 20
h = [0] * 256; h[0], h[1], h[2] = 20240801, 7, n
with open(sys.argv[1], 'wb') as f:
    f.write(struct.pack('<256i', *h)); array.array('I', [random.randrange(128256) for _ in range(n)]).tofile(f)
" build/random_tokens.bin
        MOE="$MOE --data build/random_tokens.bin"
    fi
    go ref_ep --seq 4096 --batch 2 --grad-accum 2 $MOE
    go ep2 --seq 4096 --batch 4 --nproc 2 --ep 2 $MOE
fi
if run ref2; then go ref_dp_after --seq 4096 --batch 4 --tied; fi
python3 - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import json, os, statistics, subprocess, sys
out = sys.argv[1]
def tok(name):
    f = "%s/%s.jsonl" % (out, name)
    r = [json.loads(l) for l in open(f)] if os.path.exists(f) else []
    if len(r) < 3: return None, None, None
    return statistics.median(x["tok_s"] for x in r[2:]), statistics.median(x["mfu"] for x in r[2:]), r[-1]["mem_bytes"] / 2**30
print("%-12s %-12s %12s %12s %7s %10s %11s" % ("run", "vs", "tok/s", "ref tok/s", "MFU", "efficiency", "GiB/GPU"))
for name, ref in [("ref_dp_after", "ref_dp"), ("dp2", "ref_dp"), ("dp2_dense", "ref_dp"), ("dp2_z1", "ref_dp"), ("dp2_ctas4", "ref_dp"), ("dp2_ctas8", "ref_dp"), ("dp2_z3", "ref_dp"), ("tp2_sp", "ref_dp"), ("tp2_sp_serial", "ref_dp"), ("tp2_sp_sms8", "ref_dp"), ("tp2_sp_sms32", "ref_dp"), ("tp2_sp_sms-1", "ref_dp"), ("tp2_sp_ctas8", "ref_dp"), ("pp2_1f1b", "ref_pp"),
                  ("pp2_1f1b_8_8", "ref_pp"), ("pp2_1f1b_9_7", "ref_pp"), ("cp2_zigzag", "ref_cp"), ("ep2", "ref_ep")]:
    t, mfu, mem = tok(name); tr, _, _ = tok(ref)
    if t is None or tr is None: print("%-12s %-12s missing (see runs.txt)" % (name, ref)); continue
    if name == "ref_dp_after": print("%-12s %-12s %12.0f %12.0f %6.1f%% (one GPU again: %.1f%% of the first)" % (name, ref, t, tr, 100 * mfu, 100 * t / tr)); continue
    print("%-12s %-12s %12.0f %12.0f %6.1f%% %9.1f%% %11.1f" % (name, ref, t, tr, 100 * mfu, 100 * t / (2 * tr), mem))
for name in ["ref_ep", "ep2"]:   # how balanced the routing was: max/mean tokens per expert
    f = "%s/%s.jsonl" % (out, name)
    r = [json.loads(l) for l in open(f)] if os.path.exists(f) else []
    if r and "moe_imbalance" in r[0]: print("%s moe_imbalance by step: %s; dropped: %s" % (name, " ".join("%.2f" % x["moe_imbalance"] for x in r), " ".join("%.3f" % x.get("moe_drop_frac", 0) for x in r)))
for name in ["ref_dp", "ref_dp_after", "dp2", "dp2_dense", "dp2_z1", "dp2_ctas4", "dp2_ctas8", "dp2_z3", "tp2_sp", "tp2_sp_serial", "tp2_sp_sms8", "tp2_sp_sms32", "tp2_sp_sms-1", "tp2_sp_ctas8", "ref_pp", "pp2_1f1b", "pp2_1f1b_8_8", "pp2_1f1b_9_7", "ref_cp", "cp2_zigzag", "ref_ep", "ep2"]:
    f = "%s/%s.json" % (out, name)
    if os.path.exists(f):
        print(subprocess.run([sys.executable, "bench/trace_stats.py", f, "--label", name], capture_output=True, text=True).stdout.rstrip())
PY
