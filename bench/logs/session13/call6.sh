#!/usr/bin/env bash
# session 13, call 6: s13c = branch fused-v2: the fused backward's dQ GEMM deferred by a tile
# (dS in two buffers, mbarriers instead of a barrier between the consumers, so their ping-pong
# holds) and, at HS 128, two dQ staging buffers per consumer. test_cuda (the fused backward
# against the CPU, twice with the same bits); attn_ab: the default two kernels (s13b, mode 0)
# against s13c's fused (mode 5), then s13c's fused against s13b's fused (v1, mode 5)
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
N=.dev/s13c; T0=$SECONDS
timeout 130 $N/test_cuda > $OUT/test_cuda.txt 2>&1; echo "test_cuda rc=$? $((SECONDS-T0)) s" > $OUT/summary.txt
grep -E "FAIL" $OUT/test_cuda.txt | head -8 >> $OUT/summary.txt; tail -1 $OUT/test_cuda.txt >> $OUT/summary.txt
H=16:16:128,16:4:128,32:8:64,32:32:64; S=2048,4096,8192
timeout 150 python3 bench/attn_ab.py --lib .dev/s13b/libus_attn.so --lib-b $N/libus_attn.so --mode-b 5 --att-heads $H --att-seq $S --reps 10 --kernels > $OUT/ab_2k_v2.txt 2>&1; echo "attn_ab two-kernel vs v2 rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
grep -E "kernel us-B" $OUT/ab_2k_v2.txt | grep fused | cut -c1-80 >> $OUT/summary.txt
sed -n '/one process/,$p' $OUT/ab_2k_v2.txt >> $OUT/summary.txt
timeout 100 python3 bench/attn_ab.py --lib $N/libus_attn.so --mode 5 --lib-b .dev/probe/main2.so --mode-b 5 --att-heads $H --att-seq $S --reps 10 > $OUT/ab_v2_v1.txt 2>&1; echo "attn_ab v2 vs v1 rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
sed -n '/one process/,$p' $OUT/ab_v2_v1.txt >> $OUT/summary.txt
cat $OUT/summary.txt
