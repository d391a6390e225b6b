#!/usr/bin/env bash
# session 13, call 3: call 2's attn_ab.py again (its rotation variable had shadowed SDPA's key
# tensor): s13b (persistent dK/dV) and s13a (one CTA per key block) and cuDNN, rep by rep
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
N=.dev/s13b; O=.dev/s13a; T0=$SECONDS
H=16:16:128,32:32:64,16:4:128,32:8:64; S=1024,2048,4096,8192
timeout 200 python3 bench/attn_ab.py --lib $N/libus_attn.so --lib-b $O/libus_attn.so --att-heads $H --att-seq $S > $OUT/ab.txt 2>&1; echo "attn_ab rc=$? $((SECONDS-T0)) s" > $OUT/summary.txt
sed -n '/one process/,$p' $OUT/ab.txt >> $OUT/summary.txt; tail -2 $OUT/ab.txt >> $OUT/summary.txt
cat $OUT/summary.txt
