#!/usr/bin/env bash
# session 12, call 5: s12d = the final rule (test_cuda also with the GEMM tune file) (one band while each pair has 4 CTAs at work, else
# bands of a sixth as many pairs as CTAs): test_cuda, then bench_cuda --attention at multi-head
# and GQA shapes, T 1k-8k (us-hop1b: one band), and SDPA's cuDNN backend at the same shapes; then
# bench/attn_ab.py: ours (libus_attn.so) and cuDNN in one process, rep by rep
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
N=.dev/s12d; T0=$SECONDS
H=16:16:128,32:32:64,16:4:128,32:8:64; S=1024,2048,4096,8192
timeout 100 $N/test_cuda > $OUT/test_cuda.txt 2>&1; echo "test_cuda rc=$? $((SECONDS-T0)) s" > $OUT/summary.txt
grep -E "FAIL" $OUT/test_cuda.txt | head -6 >> $OUT/summary.txt; tail -1 $OUT/test_cuda.txt >> $OUT/summary.txt
timeout 240 $N/bench_cuda --attention --att-heads $H --att-seq $S > $OUT/att.txt 2>&1; echo "attention rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
timeout 120 python3 bench/sdpa_bench.py --att-heads $H --att-seq $S --backends cudnn > $OUT/sdpa.txt 2>&1; echo "sdpa rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
timeout 150 python3 bench/attn_ab.py --lib $N/libus_attn.so --att-heads $H --att-seq $S > $OUT/ab.txt 2>&1; echo "attn_ab rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
grep -E "^us-hop |^us-hop1b" $OUT/att.txt >> $OUT/summary.txt
grep -E "^cudnn" $OUT/sdpa.txt >> $OUT/summary.txt
sed -n '/one process/,$p' $OUT/ab.txt >> $OUT/summary.txt; tail -3 $OUT/ab.txt >> $OUT/summary.txt
echo "total $((SECONDS-T0)) s" >> $OUT/summary.txt
cat $OUT/summary.txt
