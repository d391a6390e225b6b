#!/usr/bin/env bash
# session 19, call 4: s19c = the forward's and the dQ kernel's copy thread posting each ring
# stage's key tile in shared memory (us__hop_kts), the consumers reading it there: test_cuda;
# bench_cuda --cp-seq 8192,32768 and HS 96 at 32768, s19a then s19c; the causal kernels
# (unchanged PTX but for the HS 64 dQ kernel) s19a against s19c with attn_ab.py at the 1B heads
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
tar xzf .dev/c4.tgz
T0=$SECONDS
timeout 150 .dev/s19c/test_cuda > $OUT/test_s19c.txt 2>&1
echo "test_cuda s19c rc=$? $((SECONDS-T0)) s: $(tail -1 $OUT/test_s19c.txt)" > $OUT/summary.txt
grep -E "FAIL" $OUT/test_s19c.txt | head -10 >> $OUT/summary.txt
for v in s19a s19c; do
  timeout 90 .dev/$v/bench_cuda --cp-seq 8192,32768 > $OUT/cp_$v.txt 2>&1
  echo "cp $v rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
  timeout 90 .dev/$v/bench_cuda --cp-seq 32768 --cp-heads 32:32:96 > $OUT/cp96_$v.txt 2>&1
  echo "cp96 $v rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
done
timeout 150 python3 bench/attn_ab.py --lib .dev/s19a/libus_attn.so --lib-b .dev/s19c/libus_attn.so --att-heads 32:8:64 --att-seq 2048,4096,8192 --reps 20 --batch 10 > $OUT/ab.txt 2>&1
echo "attn_ab rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
for v in s19a s19c; do echo "== $v" >> $OUT/summary.txt; cat $OUT/cp_$v.txt $OUT/cp96_$v.txt | grep -E "^\| (one layer|causal|one block, positions.*hopper|cp=(2|4) (zig-zag|ring), hopper)" | cut -c1-150 >> $OUT/summary.txt; done
echo "== attn_ab (us = s19a, us-B = s19c)" >> $OUT/summary.txt; tail -12 $OUT/ab.txt >> $OUT/summary.txt
echo "total $((SECONDS-T0)) s" >> $OUT/summary.txt
cat $OUT/summary.txt
