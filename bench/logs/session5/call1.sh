#!/usr/bin/env bash
# session 5, call 1: the merged main (HS 64 backward, wgmma grouped GEMM, planner) on one H200,
# binaries built on the VM (sm_90a)
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
B=.dev/bin
git log --oneline -1 > $OUT/gpu.txt 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader >> $OUT/gpu.txt
python3 -c 'import torch; print("torch", torch.__version__)' >> $OUT/gpu.txt
t0=$SECONDS
timeout 230 stdbuf -oL $B/test_cuda > $OUT/test_cuda.txt 2>&1; echo "test_cuda rc=$? ($((SECONDS-t0)) s)"
grep -E "FAIL" $OUT/test_cuda.txt | head -10; tail -1 $OUT/test_cuda.txt
timeout 60 stdbuf -oL $B/bench_cuda --preset 1b --steps 10 --warmup 3 > $OUT/1b_us.txt 2>&1; echo "1b us rc=$?"
timeout 170 python3 bench/torch_llama.py --preset 1b --steps 10 --warmup-steps 3 --compile > $OUT/1b_compile.txt 2>&1; echo "compile rc=$? ($((SECONDS-t0)) s)"
timeout 60 stdbuf -oL $B/bench_cuda --attention > $OUT/att.txt 2>&1; echo "att rc=$?"
timeout 60 stdbuf -oL $B/bench_cuda --attention --att-seq 16384,32768 --att-heads 16:4:128,16:16:128 > $OUT/att_long.txt 2>&1; echo "att long rc=$?"
timeout 60 python3 bench/sdpa_bench.py > $OUT/sdpa.txt 2>&1; echo "sdpa rc=$? ($((SECONDS-t0)) s)"
for p in bf16 fp8 bf16 fp8; do
  timeout 40 stdbuf -oL $B/bench_cuda --preset 1b --steps 10 --warmup 3 --precision $p > $OUT/fp8pair_$p.txt 2>&1
  grep -E "^ultrascale" $OUT/fp8pair_$p.txt | cut -c1-150
done
echo "=== done $((SECONDS-t0)) s"
echo "=== 1b"; grep -E "^ultrascale|^torch" $OUT/1b_us.txt $OUT/1b_compile.txt | cut -c1-200
echo "=== att"; grep -E "us-hop|TFLOP|T=|us-" $OUT/att.txt | head -30
echo "=== att long"; grep -E "us-" $OUT/att_long.txt | head -20
echo "=== sdpa"; tail -20 $OUT/sdpa.txt
