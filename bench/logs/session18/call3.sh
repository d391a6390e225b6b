#!/usr/bin/env bash
# session 18, call 3: s18c = main with the attention scale and sl2 named once (us__attn_scale,
# us__attn_sl2): test_cuda; where the 1B step's time goes under fp8 and bf16 and the 200M step's
# (--profile); the fp8/bf16 ratio at 1B, interleaved twice
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
tar xzf .dev/c3.tgz
T0=$SECONDS; N=.dev/s18c
timeout 120 $N/test_cuda > $OUT/test_s18c.txt 2>&1
echo "test_cuda s18c rc=$? $((SECONDS-T0)) s: $(tail -1 $OUT/test_s18c.txt)" > $OUT/summary.txt
grep -E "FAIL" $OUT/test_s18c.txt | head -10 >> $OUT/summary.txt
for p in fp8 bf16; do
  timeout 60 $N/bench_cuda --preset 1b --precision $p --steps 3 --warmup 2 --profile > $OUT/prof_$p.txt 2>&1
  echo "profile 1b $p rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
done
timeout 60 $N/bench_cuda --preset 200m --steps 3 --warmup 2 --profile > $OUT/prof_200m.txt 2>&1
echo "profile 200m rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
for i in 1 2; do for p in bf16 fp8; do
  timeout 60 $N/bench_cuda --preset 1b --precision $p --steps 6 --warmup 2 > $OUT/r_${p}_$i.txt 2>&1
  echo "1b $p #$i rc=$? $((SECONDS-T0)) s: $(grep -E '^ultrascale ' $OUT/r_${p}_$i.txt | cut -c1-110)" >> $OUT/summary.txt
done; done
echo "total $((SECONDS-T0)) s" >> $OUT/summary.txt
cd $OUT && tar czf runs.tgz r_*.txt && rm -f r_*.txt && cd - > /dev/null
cat $OUT/summary.txt
