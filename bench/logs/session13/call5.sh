#!/usr/bin/env bash
# session 13, call 5: why the fused backward (mode 5: dQ inside the dK/dV kernel, its parts
# added in key-block order) loses to the two kernels. s13b's library in mode 0 (the default)
# against: the same library in mode 5; p1 = mode 5 with the writer's wait for the earlier key
# blocks removed (adds in any order: the timing of the fused kernel without its ordering); p2 =
# p1 without the dQ adds at all (wrong dQ: what the rest of the fused kernel costs). p1 and p2
# are built from sed-patched copies of ultrascale_cuda.cuh, timing probes only, never a result.
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
N=.dev/s13b; T0=$SECONDS
H=16:16:128,16:4:128,32:8:64,32:32:64; S=4096,8192
echo "start" > $OUT/summary.txt
for v in main2 p1 p2; do
  timeout 100 python3 bench/attn_ab.py --lib $N/libus_attn.so --lib-b .dev/probe/$v.so --mode-b 5 --att-heads $H --att-seq $S --reps 10 --kernels > $OUT/ab_$v.txt 2>&1; echo "attn_ab $v rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
  grep -E "kernel us-B" $OUT/ab_$v.txt | awk '$7 > 0.1' | cut -c1-100 >> $OUT/summary.txt
  sed -n '/one process/,$p' $OUT/ab_$v.txt >> $OUT/summary.txt
done
cat $OUT/summary.txt
