#!/usr/bin/env bash
# session 16, call 2: s16c = s16a with dS through memory the default at HS 96 and 128 (while its
# buffer is ≤ 1/16 of the GPU's memory): test_cuda; the 8b8 step (HS 128) against f (session
# 15's landed binary, 434469b), bf16 twice and fp8 once, interleaved; attn_ab --kernels (mode 7
# against mode 4, the two kernels) at T 4096; attn_ab at T 16k and 32k (mode 7 against mode 0)
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
T0=$SECONDS; N=.dev/s16c; cp $N/libus_attn.so /tmp/usb.so
timeout 150 $N/test_cuda > $OUT/test_s16c.txt 2>&1
echo "test_cuda s16c rc=$? $((SECONDS-T0)) s: $(tail -1 $OUT/test_s16c.txt)" > $OUT/summary.txt
grep -E "FAIL" $OUT/test_s16c.txt | head -10 >> $OUT/summary.txt
for i in 1 2; do for v in f s16c; do
  timeout 80 $( [ $v = f ] && echo .dev/fb || echo .dev/$v )/bench_cuda --preset 8b8 --steps 6 --warmup 2 --precision bf16 > $OUT/b8b8_bf16_${v}_$i.txt 2>&1
  echo "8b8 bf16 $v #$i rc=$? $((SECONDS-T0)) s: $(grep -E '^ultrascale ' $OUT/b8b8_bf16_${v}_$i.txt | cut -c1-110)" >> $OUT/summary.txt
done; done
for v in f s16c; do
  timeout 80 $( [ $v = f ] && echo .dev/fb || echo .dev/$v )/bench_cuda --preset 8b8 --steps 6 --warmup 2 --precision fp8 > $OUT/b8b8_fp8_$v.txt 2>&1
  echo "8b8 fp8 $v rc=$? $((SECONDS-T0)) s: $(grep -E '^ultrascale ' $OUT/b8b8_fp8_$v.txt | cut -c1-110)" >> $OUT/summary.txt
done
timeout 100 python3 bench/attn_ab.py --lib $N/libus_attn.so --mode 7 --lib-b /tmp/usb.so --mode-b 4 --att-heads 16:16:128,32:8:64 --att-seq 4096 --kernels > $OUT/ab_kernels.txt 2>&1
echo "attn_ab --kernels rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
timeout 150 python3 bench/attn_ab.py --lib $N/libus_attn.so --mode 7 --lib-b /tmp/usb.so --mode-b 0 --att-heads 16:16:128,16:4:128 --att-seq 16384,32768 --reps 10 > $OUT/ab_long.txt 2>&1
echo "attn_ab long rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
sed -n '/one process/,$p' $OUT/ab_long.txt | cut -c1-120 >> $OUT/summary.txt
echo "total $((SECONDS-T0)) s" >> $OUT/summary.txt
cat $OUT/summary.txt
