#!/usr/bin/env bash
# session 16, call 3: s16d = dS through memory the default at HS 96 and 128 in chunks of (batch,
# kv head) pairs whose dS takes ≤ 1/32 of the GPU's memory; bench_cuda's peak now the CUDA ops'
# own count. test_cuda; attn_ab default (us-hop) against the two kernels (mode 4, us-B) beside
# cuDNN at T 2k-8k (ten calls a sample) and at T 32k (chunks of 4 pairs); the 8b8 and 1b steps
# once (its peak with the scratch counted). First try: a division by zero (the band of 0 pairs
# where the backward took two kernels), fixed; its 8b8 run (HS 128) is in call3-first/
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
T0=$SECONDS; N=.dev/s16d; cp $N/libus_attn.so /tmp/usb.so
timeout 150 $N/test_cuda > $OUT/test_s16d.txt 2>&1
echo "test_cuda s16d rc=$? $((SECONDS-T0)) s: $(tail -1 $OUT/test_s16d.txt)" > $OUT/summary.txt
grep -E "FAIL" $OUT/test_s16d.txt | head -10 >> $OUT/summary.txt
H=16:16:128,16:4:128,32:8:64,16:8:96; S=2048,4096,8192
timeout 150 python3 bench/attn_ab.py --lib $N/libus_attn.so --mode 0 --lib-b /tmp/usb.so --mode-b 4 --att-heads $H --att-seq $S --batch 10 > $OUT/ab_b10.txt 2>&1
echo "attn_ab default vs mode 4, batch 10 rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
sed -n '/one process/,$p' $OUT/ab_b10.txt | cut -c1-120 >> $OUT/summary.txt
timeout 120 python3 bench/attn_ab.py --lib $N/libus_attn.so --mode 0 --lib-b /tmp/usb.so --mode-b 4 --att-heads 16:16:128,16:4:128 --att-seq 32768 --reps 10 > $OUT/ab_32k.txt 2>&1
echo "attn_ab T 32k default vs mode 4 rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
sed -n '/one process/,$p' $OUT/ab_32k.txt | cut -c1-120 >> $OUT/summary.txt
for p in 1b; do
  timeout 80 $N/bench_cuda --preset $p --steps 6 --warmup 2 > $OUT/step_$p.txt 2>&1
  echo "$p bf16 rc=$? $((SECONDS-T0)) s: $(grep -E '^ultrascale ' $OUT/step_$p.txt | cut -c1-110)" >> $OUT/summary.txt
done
echo "total $((SECONDS-T0)) s" >> $OUT/summary.txt
cat $OUT/summary.txt
