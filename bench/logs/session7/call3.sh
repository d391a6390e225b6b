#!/usr/bin/env bash
# session 7, call 3: the library with Wgrad on the grouped kernel by default (1b8530a): test_cuda,
# the MoE preset default against the loop; the reduce-add with an L2 evict-first hint (a variant
# binary, bench_cuda_evict) against it on bench_cuda --grouped
# binaries of 1b8530a built on the VM (nvcc 13.0, sm_90a) into .dev/s7c; .dev/var/bench_cuda_evict: the
# same with createpolicy.fractional.L2::evict_first and .L2::cache_hint on the reduce (not kept)
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
B=.dev/s7c; T0=$SECONDS
timeout 200 stdbuf -oL $B/test_cuda > $OUT/test_cuda.txt 2>&1; echo "test_cuda rc=$? $((SECONDS-T0)) s"; tail -1 $OUT/test_cuda.txt
for r in 1 2; do for p in "" --grouped-loop; do
timeout 60 stdbuf -oL $B/bench_cuda --preset moe --steps 6 --warmup 2 $p > $OUT/moe_${r}${p}.txt 2>&1
echo "moe $r '$p': $(grep -hE '^ultrascale' $OUT/moe_${r}${p}.txt | cut -c1-110)"
done; done
timeout 100 stdbuf -oL $B/bench_cuda --grouped > $OUT/grouped.txt 2>&1; echo "grouped rc=$? $((SECONDS-T0)) s"
timeout 100 stdbuf -oL .dev/var/bench_cuda_evict --grouped > $OUT/grouped_evict.txt 2>&1; echo "evict rc=$? $((SECONDS-T0)) s"
echo "Wgrad kernel TFLOP/s: main | evict-first"
paste -d'|' <(grep Wgrad $OUT/grouped.txt | cut -d'|' -f2,3,5) <(grep Wgrad $OUT/grouped_evict.txt | cut -d'|' -f5,8)
