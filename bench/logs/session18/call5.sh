#!/usr/bin/env bash
# session 18, call 5: --precision fp8 against bf16 with --gemm-tune on both (the FP8 plans are
# tuned too), 1B, interleaved twice; and 8b8 fp8 against bf16 (default), one pair; s18c
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
tar xzf .dev/c3.tgz
T0=$SECONDS; N=.dev/s18c
for i in 1 2; do for p in bf16 fp8; do
  timeout 80 $N/bench_cuda --preset 1b --precision $p --steps 6 --warmup 4 --gemm-tune > $OUT/t_${p}_$i.txt 2>&1
  echo "1b tuned $p #$i rc=$? $((SECONDS-T0)) s: $(grep -E '^ultrascale ' $OUT/t_${p}_$i.txt | cut -c1-110)" >> $OUT/summary.txt
done; done
for p in bf16 fp8; do
  timeout 80 $N/bench_cuda --preset 8b8 --precision $p --steps 6 --warmup 2 > $OUT/e_${p}.txt 2>&1
  echo "8b8 $p rc=$? $((SECONDS-T0)) s: $(grep -E '^ultrascale ' $OUT/e_${p}.txt | cut -c1-110)" >> $OUT/summary.txt
done
echo "total $((SECONDS-T0)) s" >> $OUT/summary.txt
cat $OUT/summary.txt
