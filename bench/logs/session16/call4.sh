#!/usr/bin/env bash
# session 16, call 4: s16e = s16d (518e03e) with dS stored streaming (__stcs: evict first, so as
# not to push the Q and dO that the dK/dV kernel's bands keep in L2 out of it) and read by the dQ
# kernel with an L2 evict-first hint. test_cuda; attn_ab mode 7 (dS through memory) against mode
# 4 (two kernels) of the same build, s16e then old (= s16d), ten calls a sample
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
T0=$SECONDS; N=.dev/s16e; cp $N/libus_attn.so /tmp/usb_e.so; cp .dev/old/libus_attn.so /tmp/usb_o.so
timeout 150 $N/test_cuda > $OUT/test_s16e.txt 2>&1
echo "test_cuda s16e rc=$? $((SECONDS-T0)) s: $(tail -1 $OUT/test_s16e.txt)" > $OUT/summary.txt
grep -E "FAIL" $OUT/test_s16e.txt | head -10 >> $OUT/summary.txt
H=16:16:128,16:4:128,32:8:64,32:32:64; S=4096,8192
for v in e o; do
  L=$([ $v = e ] && echo $N/libus_attn.so || echo .dev/old/libus_attn.so)
  timeout 120 python3 bench/attn_ab.py --lib $L --mode 7 --lib-b /tmp/usb_$v.so --mode-b 4 --att-heads $H --att-seq $S --batch 10 > $OUT/ab_$v.txt 2>&1
  echo "attn_ab $v: mode 7 vs mode 4, batch 10 rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
  sed -n '/one process/,$p' $OUT/ab_$v.txt | cut -c1-120 >> $OUT/summary.txt
done
echo "total $((SECONDS-T0)) s" >> $OUT/summary.txt
cat $OUT/summary.txt
