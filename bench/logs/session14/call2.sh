#!/usr/bin/env bash
# NOT RUN: every start of the device from 05:23 to 06:45 was refused; kC and block-kfrag.patch
# (the CP block kernel part) were never measured, so the patch did not land
# session 14, call 2: kC = the K/V-fragment dK/dV kernel as it lands (K's first k-steps in
# registers: HS 80 K and V whole, HS 96 K whole, HS 128 3 of 8, HS 64 none; the CP block kernel
# the same, HS 128 2 steps): test_cuda; bench_cuda --cp-flash-only, kC and m14 alternately, twice;
# attn_ab kC vs m14 with 10 calls a sample
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
M=.dev/m14; N=.dev/kC; T0=$SECONDS
timeout 120 $N/test_cuda > $OUT/test_kC.txt 2>&1; echo "test_cuda kC rc=$? $((SECONDS-T0)) s: $(tail -1 $OUT/test_kC.txt)" > $OUT/summary.txt
grep -E "FAIL" $OUT/test_kC.txt | head -6 >> $OUT/summary.txt
for r in 1 2; do for v in kC m14; do
  timeout 60 .dev/$v/bench_cuda --cp-flash-only > $OUT/cp_${v}_$r.txt 2>&1; echo "cp $v ($r) rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
done; done
H=16:16:128,16:4:128,16:8:96,16:16:80; S=2048,4096,8192
timeout 120 python3 bench/attn_ab.py --lib $N/libus_attn.so --lib-b $M/libus_attn.so --att-heads $H --att-seq $S --batch 10 > $OUT/ab10.txt 2>&1; echo "attn_ab 10 calls rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
sed -n '/one process/,$p' $OUT/ab10.txt | cut -c1-110 >> $OUT/summary.txt
for f in $OUT/cp_*.txt; do echo "== $(basename $f)"; grep -E "^\| one layer|hopper|cp=1" $f | cut -c1-112; done >> $OUT/summary.txt
echo "total $((SECONDS-T0)) s" >> $OUT/summary.txt
tar czf $OUT/logs.tgz -C $OUT $(cd $OUT && ls cp_*.txt) && rm $OUT/cp_*.txt
cat $OUT/summary.txt
