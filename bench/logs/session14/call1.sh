#!/usr/bin/env bash
# session 14, call 1: m14 = main at 1965a6a (the review's dK/dV walk written once, never run on a
# GPU): test_cuda. kA, kB = the dK/dV kernel with the first k-steps of K (and at HS 80 of V) as
# wgmma A fragments in registers (kA: HS 64 3 steps, 128 4; kB: HS 64 2, 128 3; both HS 80 K and
# V whole, HS 96 K whole): kB's test_cuda; attn_ab of each against m14, one process each, twice
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
M=.dev/m14; T0=$SECONDS
timeout 120 $M/test_cuda > $OUT/test_m14.txt 2>&1; echo "test_cuda m14 rc=$? $((SECONDS-T0)) s: $(tail -1 $OUT/test_m14.txt)" > $OUT/summary.txt
timeout 120 .dev/kB/test_cuda > $OUT/test_kB.txt 2>&1; echo "test_cuda kB rc=$? $((SECONDS-T0)) s: $(tail -1 $OUT/test_kB.txt)" >> $OUT/summary.txt
grep -E "FAIL" $OUT/test_m14.txt $OUT/test_kB.txt | head -6 >> $OUT/summary.txt
H=16:16:128,16:4:128,32:8:64,32:32:64,16:8:96,16:16:80; S=2048,4096,8192
for r in 1 2; do for v in kA kB; do
  timeout 100 python3 bench/attn_ab.py --lib .dev/$v/libus_attn.so --lib-b $M/libus_attn.so --att-heads $H --att-seq $S > $OUT/ab_${v}_$r.txt 2>&1; echo "attn_ab $v vs m14 ($r) rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
  sed -n '/one process/,$p' $OUT/ab_${v}_$r.txt | cut -c1-110 >> $OUT/summary.txt
done; done
cat $OUT/summary.txt
