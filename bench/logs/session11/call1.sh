#!/usr/bin/env bash
# session 11, call 1: the causal dK/dV tile masked in a pass of its own on diagonal tiles (s11b)
# against main 03c5e78 (s11a): test_cuda, attention A/B twice, SDPA; Nsight Compute on the one
# shape still behind cuDNN (16/4/128, T 8192 backward), ours and cuDNN's; the 1B step A/B,
# torch.compile, and one profiled step
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
N=.dev/s11b; P=.dev/s11a; T0=$SECONDS
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
timeout 200 stdbuf -oL $N/test_cuda > $OUT/test_cuda.txt 2>&1; echo "test_cuda rc=$? $((SECONDS-T0)) s"; grep -E "FAIL" $OUT/test_cuda.txt | head -5; tail -1 $OUT/test_cuda.txt
H="--attention --att-heads 32:8:64,16:4:128"
for i in 1 2; do
  timeout 100 stdbuf -oL $P/bench_cuda $H > $OUT/att_prev$i.txt 2>&1
  timeout 100 stdbuf -oL $N/bench_cuda $H > $OUT/att_new$i.txt 2>&1
done
timeout 100 python3 bench/sdpa_bench.py > $OUT/sdpa.txt 2>&1; echo "attention done $((SECONDS-T0)) s"
S="--preset 1b --steps 6 --warmup 2"
run() { timeout 90 stdbuf -oL $3/bench_cuda $2 > $OUT/$1.txt 2>&1; echo "$1: $(grep -hE '^ultrascale' $OUT/$1.txt | cut -c1-110) ($((SECONDS-T0)) s)"; }
tl() { timeout 200 python3 bench/torch_llama.py $2 > $OUT/$1.txt 2>&1; echo "$1: $(grep -hE '^torch' $OUT/$1.txt | cut -c1-110) ($((SECONDS-T0)) s)"; }
run bf16_prev "$S" $P
run bf16_new "$S" $N
tl compile "--preset 1b --steps 6 --warmup-steps 2 --compile"
run bf16_prev2 "$S" $P
run bf16_new2 "$S" $N
run prof "--preset 1b --steps 3 --warmup 2 --profile" $N
SEC="--section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats --section WarpStateStats --section ComputeWorkloadAnalysis --section InstructionStats"
timeout 150 ncu $SEC -k regex:us__hop_dkdv_kernel\|us__hop_dq_kernel --launch-count 2 $N/bench_cuda --attention --att-heads 16:4:128 --att-seq 8192 > $OUT/ncu_ours.txt 2>&1; echo "ncu ours rc=$? $((SECONDS-T0)) s"
timeout 150 ncu $SEC --launch-skip 4 --launch-count 14 python3 bench/logs/session11/cudnn_bwd_once.py > $OUT/ncu_cudnn.txt 2>&1; echo "ncu cudnn rc=$? $((SECONDS-T0)) s"
echo "total $((SECONDS-T0)) s"
grep -E "^  [a-zA-Z_].*\(|Duration|Issue Slots Busy|No Eligible|Active Warps Per|Eligible Warps|Registers Per|Executed Ipc A|Theoretical Occ" $OUT/ncu_ours.txt $OUT/ncu_cudnn.txt | cut -c1-150 | head -90
sed -n '/step profile\|profile/,$p' $OUT/prof.txt | head -40
for i in 1 2; do for f in prev new; do echo "== $f $i"; grep -E "^us-hop " $OUT/att_$f$i.txt; done; done
grep -E "^cudnn" $OUT/sdpa.txt
