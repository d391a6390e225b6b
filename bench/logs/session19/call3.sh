#!/usr/bin/env bash
# session 19, call 3: s19b = s19a with the forward and dQ consumers fetching the next key tile's
# index and ranges a tile ahead (us__hop_kt): test_cuda; bench_cuda --cp-seq 8192,32768 (HS 128
# and 64) and --cp-seq 32768 --cp-heads 32:32:96, s19a then s19b, in one call
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
tar xzf .dev/c3.tgz
T0=$SECONDS
timeout 150 .dev/s19b/test_cuda > $OUT/test_s19b.txt 2>&1
echo "test_cuda s19b rc=$? $((SECONDS-T0)) s: $(tail -1 $OUT/test_s19b.txt)" > $OUT/summary.txt
grep -E "FAIL" $OUT/test_s19b.txt | head -10 >> $OUT/summary.txt
for v in s19a s19b; do
  timeout 90 .dev/$v/bench_cuda --cp-seq 8192,32768 > $OUT/cp_$v.txt 2>&1
  echo "cp $v rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
  timeout 90 .dev/$v/bench_cuda --cp-seq 32768 --cp-heads 32:32:96 > $OUT/cp96_$v.txt 2>&1
  echo "cp96 $v rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
done
for v in s19a s19b; do echo "== $v" >> $OUT/summary.txt; cat $OUT/cp_$v.txt $OUT/cp96_$v.txt | grep -E "^\| (one layer|causal|one block, positions.*hopper|cp=(2|4) (zig-zag|ring), hopper)" | cut -c1-150 >> $OUT/summary.txt; done
echo "total $((SECONDS-T0)) s" >> $OUT/summary.txt
cat $OUT/summary.txt
