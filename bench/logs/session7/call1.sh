#!/usr/bin/env bash
# session 7, call 1: test_cuda at 7544a88 (the FP8 epilogue refactor's first run), ncu of the
# grouped GEMM's Wgrad and Dgrad launches (why Wgrad runs at half the loop's rate)
# binaries of 7544a88, built on the VM (nvcc 13.0, sm_90a) into .dev/s7
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
B=.dev/s7; T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
timeout 200 stdbuf -oL $B/test_cuda > $OUT/test_cuda.txt 2>&1; echo "test_cuda rc=$? $((SECONDS-T0)) s"
tail -2 $OUT/test_cuda.txt
timeout 60 stdbuf -oL $B/test_cuda -v --fp8 > $OUT/test_cuda_fp8.txt 2>&1; echo "fp8 rc=$? $((SECONDS-T0)) s"; tail -1 $OUT/test_cuda_fp8.txt
for m in 2 1; do
timeout 150 ncu --kernel-name-base mangled -k regex:"ggh_kernelI13__nv_bfloat16Li${m}E" --launch-skip 2 --launch-count 1 --set full $B/bench_cuda --grouped > $OUT/ncu_mode$m.txt 2>&1; echo "ncu $m rc=$? $((SECONDS-T0)) s"
done
grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Registers Per|Stall|Warp Cycles Per Issued|Issue Slots Busy|L2 Hit|Shared Memory Bank|spill|Block Size|Grid Size" $OUT/ncu_mode2.txt | head -40
echo ---
grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Warp Cycles Per Issued|L2 Hit" $OUT/ncu_mode1.txt | head -12
echo "total $((SECONDS-T0)) s"
