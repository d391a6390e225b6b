#!/usr/bin/env bash
# session 13, call 9: s13e = branch fused-v2 plus v3 (at HS 128 one consumer takes a tile's whole
# dQ, N = 128, the two alternating): test_cuda (the fused backward against the CPU, twice with
# the same bits); attn_ab at HS 128: the default two kernels (s13d, mode 0) against s13e's fused
# (mode 5); then s13e's fused against s13d's fused (v1, mode 5)
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
N=.dev/s13e; T0=$SECONDS
timeout 100 $N/test_cuda > $OUT/test_cuda.txt 2>&1; echo "test_cuda rc=$? $((SECONDS-T0)) s" > $OUT/summary.txt
grep -E "FAIL" $OUT/test_cuda.txt | head -8 >> $OUT/summary.txt; tail -1 $OUT/test_cuda.txt >> $OUT/summary.txt
H=16:16:128,16:4:128; S=2048,4096,8192
timeout 60 python3 bench/attn_ab.py --lib .dev/s13d/libus_attn.so --lib-b $N/libus_attn.so --mode-b 5 --att-heads $H --att-seq $S --reps 10 > $OUT/ab_2k_v3.txt 2>&1; echo "attn_ab two-kernel vs v3 rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
sed -n '/one process/,$p' $OUT/ab_2k_v3.txt >> $OUT/summary.txt
timeout 60 python3 bench/attn_ab.py --lib $N/libus_attn.so --mode 5 --lib-b .dev/s13d/libus_attn.so --mode-b 5 --att-heads $H --att-seq $S --reps 10 > $OUT/ab_v3_v1.txt 2>&1; echo "attn_ab v3 vs v1 rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
sed -n '/one process/,$p' $OUT/ab_v3_v1.txt >> $OUT/summary.txt
cat $OUT/summary.txt
