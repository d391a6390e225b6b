#!/usr/bin/env bash
# session 17, call 3: s17c = the session's library (s17b's deferred dQ, its non-deferred tile
# written with the same batch helper): test_cuda; attn_ab against qs4 (s17c with four dQ stages
# at HS 64, a probe); the whole bench/run_gpu.sh (the step against eager and torch.compile,
# attention against SDPA, attn_ab with 1 and 10 calls a sample, CP, gemm_steps)
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
T0=$SECONDS; N=.dev/s17c; cp .dev/qs4/libus_attn.so /tmp/usb.so
timeout 120 $N/test_cuda > $OUT/test_s17c.txt 2>&1
echo "test_cuda s17c rc=$? $((SECONDS-T0)) s: $(tail -1 $OUT/test_s17c.txt)" > $OUT/summary.txt
grep -E "FAIL" $OUT/test_s17c.txt | head -10 >> $OUT/summary.txt
timeout 100 python3 bench/attn_ab.py --lib $N/libus_attn.so --lib-b /tmp/usb.so --att-heads 32:8:64,32:32:64 --att-seq 4096,8192 --reps 20 --batch 10 > $OUT/ab_qs4.txt 2>&1
echo "attn_ab qs4 rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
mkdir -p $OUT/run
B=$N OUT=$OUT/run timeout 420 bash bench/run_gpu.sh > $OUT/run_gpu.txt 2>&1; echo "run_gpu rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
tar czf $OUT/run_logs.tgz -C $OUT run && rm -rf $OUT/run
sed -n '/one process/,$p' $OUT/ab_qs4.txt | cut -c1-130 >> $OUT/summary.txt
sed -n '/=== summary/,$p' $OUT/run_gpu.txt >> $OUT/summary.txt
echo "total $((SECONDS-T0)) s" >> $OUT/summary.txt
rm -f $OUT/test_s17c.txt.gz; gzip -k $OUT/test_s17c.txt 2>/dev/null; rm -f $OUT/test_s17c.txt
cat $OUT/summary.txt
