#!/usr/bin/env bash
# session 7, call 2: the grouped GEMM's Wgrad through the copy engine's reduce-add (cp.reduce.
# async.bulk.tensor): correctness, the kernel against the loop, the MoE preset on each path
# binaries built on the VM (nvcc 13.0, sm_90a) into .dev/s7b from the kernel code of 1b8530a, with
# us__gg_auto still sending Wgrad to the loop (the rule changed after this call)
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
B=.dev/s7b; T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
timeout 120 stdbuf -oL $B/test_cuda -v --moe > $OUT/test_cuda_moe.txt 2>&1; echo "test_cuda --moe rc=$? $((SECONDS-T0)) s"; tail -1 $OUT/test_cuda_moe.txt
grep -i fail $OUT/test_cuda_moe.txt | grep -v "0 failed" | head -5
timeout 200 stdbuf -oL $B/bench_cuda --grouped > $OUT/grouped.txt 2>&1; echo "grouped rc=$? $((SECONDS-T0)) s"
for r in 1 2; do for p in "" --grouped-wgmma --grouped-loop; do
timeout 60 stdbuf -oL $B/bench_cuda --preset moe --steps 6 --warmup 2 $p > $OUT/moe_${r}${p}.txt 2>&1
echo "moe $r '$p': $(grep -hE '^ultrascale' $OUT/moe_${r}${p}.txt | cut -c1-150)"
done; done
echo "total $((SECONDS-T0)) s"
grep -E "Wgrad" $OUT/grouped.txt | cut -c1-200
