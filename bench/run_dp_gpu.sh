#!/usr/bin/env bash
# Data parallelism and ZeRO on 2 GPUs (the nvidia-h200-x2 machine), run from the repo root with
# build/train_cuda, build/test_nccl and build/test_cuda built here (make build/train_cuda ...):
#   1. test_nccl: every NCCL collective against host references, then its fault mode
#   2. equivalence: dp 2 with ZeRO 0-3 against one GPU, fp32 and bf16, loss curves compared
#   3. the multi-node path: two processes started by hand with torchrun's variables (TCP rendezvous)
#   4. a fault: rank 1 killed mid-training, rank 0 must exit with an error within --comm-timeout
#   5. throughput of one training step, dp 1 vs dp 2 x ZeRO 0-3, and a trace
#   (2a'. dp 2 with the embedding's gradient by rows; 2b'. tp 2 + sp with chunked reduce-scatters;
#    2b. tensor parallelism: tp 2 and tp 2 + sp against one GPU; 2c. context parallelism, cp 2;
#    2d/2e. pipeline equivalence and throughput; 2f. expert parallelism, ep 2; 2g. FP8 under tp and dp)
# Logs go to $OUT (default /tmp/dp_gpu); the last lines printed are a summary table.
set -u
export NCCL_NVLS_ENABLE=0            # NVLink multicast is not allowed on this machine
OUT=${OUT:-/tmp/dp_gpu}; mkdir -p "$OUT"
T="timeout ${RUN_TIMEOUT:-150} build/train_cuda"   # no single run may eat the session
DATA=${DATA:-build/tinyshakespeare.txt}
summary="$OUT/summary.txt"; : > "$summary"
say() { echo "$*" | tee -a "$summary"; }

[ "${SECTIONS:-nccl}" != "${SECTIONS#*nccl}" ] || true
if [ -z "${SECTIONS:-}" ] || [[ " $SECTIONS " == *" nccl "* ]]; then timeout 120 stdbuf -oL ./build/test_nccl > "$OUT/test_nccl.txt" 2>&1; say "test_nccl: exit $? | $(grep -E 'passed, [0-9]+ failed' "$OUT/test_nccl.txt" | tail -1)"; fi

compare() {   # compare A.jsonl B.jsonl -> max relative loss difference
    python3 - "$1" "$2" <<'PY'
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
n = min(len(a), len(b))
d = [abs(x - y) / abs(x) for x, y in zip(a[:n], b[:n])]
# step 1 is the same weights on the same data (only summation order differs); later steps also
# carry the updates, whose rounding differences the training dynamics amplify
print("%d steps, rel diff step 1 %.1e, steps 1-5 %.1e, all %.1e, final %.4f vs %.4f" % (n, d[0], max(d[:5]), max(d), a[n-1], b[n-1]) if n else "no steps")
PY
}
run() { case " ${SECTIONS:-nccl equiv tp cp pp pptput ep tcp fault tput} " in *" $1 "*) return 0;; *) return 1;; esac; }
# 2. equivalence on a 6-layer, dim-512 model, Shakespeare, 4 MB buckets (many in flight), 20 steps.
#    The one-GPU reference runs the same GEMM shapes as a rank (2 micro-batches of 8 sequences;
#    a rank of dp 2 runs 1 of 8 and the group 16): what differs is only the order in which the
#    gradient sums happen (and the embedding's atomics), the thing DP changes.
M="--data $DATA --layers 6 --dim 512 --heads 8 --seq 256 --steps 20 --eval-every 0 --quiet --bucket-mb 4 --lr 1e-3"
if run equiv; then for p in fp32 bf16; do
    $T $M --batch 8 --grad-accum 2 --precision $p --log "$OUT/ts_dp1_$p.jsonl" > "$OUT/ts_dp1_$p.txt" 2>&1
    for z in 0 1 2 3; do
        [ $p = bf16 ] && [ $z = 1 -o $z = 2 ] && continue
        $T $M --batch 16 --nproc 2 --zero $z --precision $p --log "$OUT/ts_dp2_z${z}_$p.jsonl" > "$OUT/ts_dp2_z${z}_$p.txt" 2>&1
        say "shakespeare $p dp2 zero$z vs 1 GPU: $(compare "$OUT/ts_dp1_$p.jsonl" "$OUT/ts_dp2_z${z}_$p.jsonl")"
    done
done; fi

# 2a'. the embedding's gradient by touched rows (issue 9): a 32768-row vocabulary over Shakespeare's
#      bytes makes dp 2 reduce the last micro-batch's lookup gradient as packed rows; against one GPU,
#      and against the dense reduction (--dense-emb-grad).
if run embrows; then
    $T $M --vocab 32768 --batch 8 --grad-accum 2 --log "$OUT/er_dp1.jsonl" > "$OUT/er_dp1.txt" 2>&1
    for x in "" "--dense-emb-grad"; do
        $T $M --vocab 32768 --batch 16 --nproc 2 $x --log "$OUT/er_dp2$x.jsonl" > "$OUT/er_dp2$x.txt" 2>&1
        say "shakespeare fp32 vocab 32768 dp2 $x vs 1 GPU: $(compare "$OUT/er_dp1.jsonl" "$OUT/er_dp2$x.jsonl")"
    done
fi
# 2g. FP8 (issue 10) on NCCL: tp 2 + sp and dp 2 against one GPU (dim 512 with 8 heads of 64: the
#     per-rank slices are whole 128-tiles, so the ranks quantise the tiles one GPU does), and tp 2 +
#     sp with the weight cache off, which must give the cached run's losses to the bit.
if run fp8; then
    $T $M --batch 16 --precision fp8 --fp8-min-dim 16 --log "$OUT/f8_ref.jsonl" > "$OUT/f8_ref.txt" 2>&1
    for x in "" "--fp8-no-weight-cache"; do
        $T $M --batch 16 --nproc 2 --tp 2 --sp --precision fp8 --fp8-min-dim 16 $x --log "$OUT/f8_tp2$x.jsonl" > "$OUT/f8_tp2$x.txt" 2>&1
    done
    say "shakespeare fp8 tp2 sp vs 1 GPU: $(compare "$OUT/f8_ref.jsonl" "$OUT/f8_tp2.jsonl")"
    say "shakespeare fp8 tp2 sp, weight cache off vs on: $(compare "$OUT/f8_tp2.jsonl" "$OUT/f8_tp2--fp8-no-weight-cache.jsonl")"
    $T $M --batch 8 --grad-accum 2 --precision fp8 --fp8-min-dim 16 --log "$OUT/f8_dp1.jsonl" > "$OUT/f8_dp1.txt" 2>&1
    $T $M --batch 16 --nproc 2 --precision fp8 --fp8-min-dim 16 --log "$OUT/f8_dp2.jsonl" > "$OUT/f8_dp2.txt" 2>&1
    say "shakespeare fp8 dp2 vs 1 GPU (2 micro-batches): $(compare "$OUT/f8_dp1.jsonl" "$OUT/f8_dp2.jsonl")"
fi

# 2b'. tp 2 + sp at T 1024 (issue 9): 8192 rows per rank, so the forward's reduce-scatters go in
#      two chunks under their GEMMs; against one GPU, fp32, and the serial path (--tp-no-overlap).
if run tpchunk; then
    $T $M --seq 1024 --batch 16 --log "$OUT/tc_ref.jsonl" > "$OUT/tc_ref.txt" 2>&1
    for x in "" "--tp-no-overlap"; do
        $T $M --seq 1024 --batch 16 --nproc 2 --tp 2 --sp $x --log "$OUT/tc_tp2$x.jsonl" > "$OUT/tc_tp2$x.txt" 2>&1
        say "shakespeare fp32 T 1024 tp2 sp $x vs 1 GPU: $(compare "$OUT/tc_ref.jsonl" "$OUT/tc_tp2$x.jsonl")"
    done
fi

# 2b. tensor parallelism (issue 5): tp 2 and tp 2 + sp against one GPU on the same model, 20 steps.
#     The reference runs the whole micro-batch of 16 (a TP rank runs all 16 sequences too).
if run tp; then for p in fp32 bf16; do
    $T $M --batch 16 --precision $p --log "$OUT/tp_ref_$p.jsonl" > "$OUT/tp_ref_$p.txt" 2>&1
    for x in "" "--sp"; do
        $T $M --batch 16 --nproc 2 --tp 2 $x --precision $p --log "$OUT/tp2${x}_$p.jsonl" > "$OUT/tp2${x}_$p.txt" 2>&1
        say "shakespeare $p tp2 $x vs 1 GPU: $(compare "$OUT/tp_ref_$p.jsonl" "$OUT/tp2${x}_$p.jsonl")"
    done
done; fi

# 2c. context parallelism (issue 6): cp 2 in each mode against one GPU, same model, seq 256
if run cp; then for p in fp32 bf16; do
    [ -f "$OUT/tp_ref_$p.jsonl" ] || $T $M --batch 16 --precision $p --log "$OUT/tp_ref_$p.jsonl" > "$OUT/tp_ref_$p.txt" 2>&1
    for x in ring zigzag allgather; do
        $T $M --batch 16 --nproc 2 --cp 2 --cp-mode $x --precision $p --log "$OUT/cp2_${x}_$p.jsonl" > "$OUT/cp2_${x}_$p.txt" 2>&1
        say "shakespeare $p cp2 $x vs 1 GPU: $(compare "$OUT/tp_ref_$p.jsonl" "$OUT/cp2_${x}_$p.jsonl")"
    done
done; fi

# 2d. pipeline parallelism (issue 7): pp 2 with every schedule (PP_SCHEDULES) over 4 micro-batches against one GPU
#     accumulating the same 4 micro-batches of 4 sequences. Activations and gradients travel on
#     channels (a communicator and stream each), sends posted as produced: a deadlock would show here.
#     PP_FLAGS=--pp-clock runs every schedule on the clock plan instead (also for 2e).
if run pp; then for p in fp32 bf16; do
    $T $M --batch 4 --grad-accum 4 --precision $p --log "$OUT/pp_ref_$p.jsonl" > "$OUT/pp_ref_$p.txt" 2>&1
    for x in ${PP_SCHEDULES:-1f1b afab zb1 interleaved zbv dualpipev}; do
        $T $M --batch 4 --grad-accum 4 --nproc 2 --pp 2 --pp-schedule $x ${PP_FLAGS:-} --precision $p --log "$OUT/pp2_${x}_$p.jsonl" > "$OUT/pp2_${x}_$p.txt" 2>&1
        say "shakespeare $p pp2 $x vs 1 GPU: $(compare "$OUT/pp_ref_$p.jsonl" "$OUT/pp2_${x}_$p.jsonl") $(grep -m1 'train:' "$OUT/pp2_${x}_$p.txt" | head -c 200)"
    done
done; fi

# 2f. expert parallelism (issue 8): a MoE variant (4 experts, top-2, 2 per rank) with ep 2 over
#     dp 2 against one GPU running each rank's micro-batch as its own (--grad-accum 2): routing
#     statistics (aux loss, capacity) are per micro-batch, so this is the run ep must reproduce
if run ep; then for p in fp32 bf16; do
    $T $M --batch 8 --grad-accum 2 --experts 4 --top-k 2 --precision $p --log "$OUT/ep_ref_$p.jsonl" > "$OUT/ep_ref_$p.txt" 2>&1
    $T $M --batch 16 --nproc 2 --ep 2 --experts 4 --top-k 2 --precision $p --log "$OUT/ep2_$p.jsonl" > "$OUT/ep2_$p.txt" 2>&1
    say "shakespeare $p moe ep2 vs 1 GPU: $(compare "$OUT/ep_ref_$p.jsonl" "$OUT/ep2_$p.jsonl") $(grep -m1 'train:' "$OUT/ep2_$p.txt" | head -c 200)"
    # dp 2 with every expert on both ranks: expert gradients reduced over the expert-dp group
    $T $M --batch 16 --nproc 2 --experts 4 --top-k 2 --precision $p --log "$OUT/ep1dp2_$p.jsonl" > "$OUT/ep1dp2_$p.txt" 2>&1
    say "shakespeare $p moe dp2 (ep 1) vs 1 GPU: $(compare "$OUT/ep_ref_$p.jsonl" "$OUT/ep1dp2_$p.jsonl")"
done
# the DeepSeek-V3 router on the GPU: sigmoid gates, a shared expert, 8 experts in 4 groups (2 per token), bias balancing
R="--experts 8 --top-k 2 --moe-gate sigmoid --shared-expert --moe-groups 4 --moe-top-groups 2 --precision fp32"
$T $M --batch 8 --grad-accum 2 $R --log "$OUT/ep_dsv3_ref.jsonl" > "$OUT/ep_dsv3_ref.txt" 2>&1
$T $M --batch 16 --nproc 2 --ep 2 $R --log "$OUT/ep_dsv3.jsonl" > "$OUT/ep_dsv3.txt" 2>&1
say "shakespeare fp32 moe ep2 sigmoid+shared+groups vs 1 GPU: $(compare "$OUT/ep_dsv3_ref.jsonl" "$OUT/ep_dsv3.jsonl")"
fi

# 2e. pipeline throughput: 8 layers, dim 1024, T 512, 8 micro-batches of 8, bf16; one GPU
#     accumulating the same micro-batches, then pp 2 with each schedule (median of steps 3-6)
if run pptput; then
Q="--data $DATA --layers 8 --dim 1024 --heads 16 --seq 512 --batch 8 --grad-accum 8 --steps 6 --eval-every 0 --precision bf16 --lr 3e-4 --quiet"
$T $Q --log "$OUT/pptput_ref.jsonl" > "$OUT/pptput_ref.txt" 2>&1
for x in ${PP_SCHEDULES:-1f1b afab zb1 interleaved zbv dualpipev}; do
    $T $Q --nproc 2 --pp 2 --pp-schedule $x ${PP_FLAGS:-} --log "$OUT/pptput_$x.jsonl" > "$OUT/pptput_$x.txt" 2>&1
done
python3 - "$OUT" ${PP_SCHEDULES:-1f1b afab zb1 interleaved zbv dualpipev} <<'PY' | tee -a "$summary"
import json, sys, statistics, os
out = sys.argv[1]
for name in ["ref"] + sys.argv[2:]:
    f = "%s/pptput_%s.jsonl" % (out, name)
    r = [json.loads(l) for l in open(f)] if os.path.exists(f) else []
    if len(r) < 4: print("pp throughput %-12s | %d steps logged" % (name, len(r))); continue
    print("pp throughput %-12s | %9.0f tok/s | loss@%d %.4f" % ("1 GPU" if name == "ref" else "pp2 " + name,
          statistics.median(x["tok_s"] for x in r[2:]), r[-1]["step"], r[-1]["loss"]))
PY
fi

# 3. two processes started by hand, as a launcher on two nodes would (TCP rendezvous on localhost)
if run tcp; then
E="MASTER_ADDR=127.0.0.1 MASTER_PORT=29561 WORLD_SIZE=2"
env $E RANK=0 LOCAL_RANK=0 $T --dp 2 --zero 1 --steps 50 --eval-every 0 --quiet --log "$OUT/tcp.jsonl" > "$OUT/tcp_r0.txt" 2>&1 &
p0=$!
env $E RANK=1 LOCAL_RANK=1 $T --dp 2 --zero 1 --steps 50 --eval-every 0 --quiet > "$OUT/tcp_r1.txt" 2>&1
r1=$?; wait $p0; r0=$?
$T --dp 1 --zero 1 --steps 50 --eval-every 0 --quiet --log "$OUT/tcp_ref.jsonl" > /dev/null 2>&1
say "torchrun-style 2 processes (TCP rendezvous): exit $r0/$r1 | vs 1 GPU: $(compare "$OUT/tcp_ref.jsonl" "$OUT/tcp.jsonl")"
fi

# 4. fault: kill rank 1 mid-training; rank 0 must fail by itself within --comm-timeout 10
#    (bounded here: if rank 0 is still alive 60 s after the kill, it is reported as hung and killed)
if run fault; then
E="MASTER_ADDR=127.0.0.1 MASTER_PORT=29563 WORLD_SIZE=2"
env $E RANK=0 LOCAL_RANK=0 build/train_cuda --dp 2 --steps 1000000 --eval-every 0 --quiet --comm-timeout 10 > "$OUT/fault_r0.txt" 2>&1 &
p0=$!
env $E RANK=1 LOCAL_RANK=1 build/train_cuda --dp 2 --steps 1000000 --eval-every 0 --quiet --comm-timeout 10 > "$OUT/fault_r1.txt" 2>&1 &
p1=$!
sleep 10; kill -9 $p1; tk=$(date +%s.%N)
while kill -0 $p0 2>/dev/null && [ "$(python3 -c "import time; print(int(time.time() - $tk > 60))")" = 0 ]; do sleep 0.5; done
if kill -0 $p0 2>/dev/null; then kill -9 $p0; wait $p0 2>/dev/null; say "fault: rank 0 still running 60 s after rank 1 was killed: HUNG"
else wait $p0; rc=$?; te=$(date +%s.%N)
    say "fault: rank 1 killed; rank 0 exited with code $rc after $(python3 -c "print('%.1f' % ($te - $tk))") s: $(grep -m1 'rank 0' "$OUT/fault_r0.txt" | head -c 300)"
fi
fi

# 5. throughput: a 12-layer dim-768 model (GPT-2 small shape), bf16, seq 1024, global batch 16
if run tput; then
P="--data $DATA --layers 12 --dim 768 --heads 12 --seq 1024 --batch 16 --steps 10 --eval-every 0 --precision bf16 --lr 6e-4"
$T $P --log "$OUT/tp_dp1.jsonl" > "$OUT/tp_dp1.txt" 2>&1
for z in 0 3; do $T $P --nproc 2 --zero $z --log "$OUT/tp_dp2_z$z.jsonl" > "$OUT/tp_dp2_z$z.txt" 2>&1; done
$T $P --nproc 2 --zero 0 --steps 4 --trace "$OUT/dp2_trace.json" > "$OUT/tp_trace.txt" 2>&1
python3 - "$OUT" <<'PY' | tee -a "$summary"
import json, sys, statistics, os
out = sys.argv[1]
def row(name, f):
    if not os.path.exists(f): print("%-22s | missing" % name); return
    r = [json.loads(l) for l in open(f)]
    if len(r) < 4: print("%-22s | only %d steps" % (name, len(r))); return
    tok = statistics.median(x["tok_s"] for x in r[2:]); mem = r[-1]["mem_bytes"] / 2**30
    print("%-22s | %9.0f tok/s | MFU %5.1f%% | peak %6.2f GiB/rank | loss@%d %.4f" % (name, tok, 100 * statistics.median(x["mfu"] for x in r[2:]), mem, r[-1]["step"], r[-1]["loss"]))
row("dp1", out + "/tp_dp1.jsonl")
for z in (0, 3): row("dp2 zero%d" % z, out + "/tp_dp2_z%d.jsonl" % z)
PY
fi
