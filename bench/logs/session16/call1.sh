#!/usr/bin/env bash
# session 16, call 1: s16a = main at 434469b and the backward with dS through memory (mode 7):
# test_cuda; attn_ab of mode 7 against mode 0 (the two kernels) of the same build, beside cuDNN,
# one process, once with one call a sample and once with ten
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
T0=$SECONDS
timeout 150 .dev/s16a/test_cuda > $OUT/test_s16a.txt 2>&1
echo "test_cuda s16a rc=$? $((SECONDS-T0)) s: $(tail -1 $OUT/test_s16a.txt)" > $OUT/summary.txt
grep -E "FAIL" $OUT/test_s16a.txt | head -10 >> $OUT/summary.txt
H=16:16:128,16:4:128,32:8:64,32:32:64,16:8:96,16:16:80; S=2048,4096,8192
for bt in 1 10; do
  timeout 150 python3 bench/attn_ab.py --lib .dev/s16a/libus_attn.so --mode 7 --lib-b .dev/s16b/libus_attn.so --mode-b 0 --att-heads $H --att-seq $S --batch $bt > $OUT/ab_b$bt.txt 2>&1
  echo "attn_ab mode 7 (us-hop) vs 0 (us-B), batch $bt rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
  sed -n '/one process/,$p' $OUT/ab_b$bt.txt | cut -c1-120 >> $OUT/summary.txt
done
echo "total $((SECONDS-T0)) s" >> $OUT/summary.txt
cat $OUT/summary.txt
