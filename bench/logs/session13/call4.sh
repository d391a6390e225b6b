#!/usr/bin/env bash
# session 13, call 4: where the backward's time goes, kernel by kernel (attn_ab.py --kernels:
# torch.profiler over ours, s13b, and SDPA's cuDNN backend) at T 4k and 8k
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
N=.dev/s13b; T0=$SECONDS
timeout 200 python3 bench/attn_ab.py --lib $N/libus_attn.so --att-heads 16:16:128,16:4:128,32:8:64,32:32:64 --att-seq 4096,8192 --reps 10 --kernels > $OUT/ab.txt 2>&1; echo "attn_ab rc=$? $((SECONDS-T0)) s" > $OUT/summary.txt
grep -E "kernel " $OUT/ab.txt | awk '$6 > 0.02' | cut -c1-120 >> $OUT/summary.txt
sed -n '/one process/,$p' $OUT/ab.txt >> $OUT/summary.txt; tail -2 $OUT/ab.txt >> $OUT/summary.txt
cat $OUT/summary.txt
