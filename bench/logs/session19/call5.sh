#!/usr/bin/env bash
# session 19, call 5: s19g = s19c's kernels (the final commit's attention PTX) with
# attn_block_finish reading 4 fp32 a lane (16-byte loads) and storing 4 elements: test_cuda;
# bench_cuda --cp-seq 8192,32768, s19c then s19g, then s19c again
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
tar xzf .dev/c5.tgz
T0=$SECONDS
timeout 150 .dev/s19g/test_cuda > $OUT/test_s19g.txt 2>&1
echo "test_cuda s19g rc=$? $((SECONDS-T0)) s: $(tail -1 $OUT/test_s19g.txt)" > $OUT/summary.txt
grep -E "FAIL" $OUT/test_s19g.txt | head -10 >> $OUT/summary.txt
i=0
for v in s19c s19g s19c; do
  i=$((i+1))
  timeout 90 .dev/$v/bench_cuda --cp-seq 8192,32768 > $OUT/cp_${i}_$v.txt 2>&1
  echo "cp $v rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
  echo "== $v" >> $OUT/summary.txt; grep -E "^\| (one layer|causal|one block, positions.*hopper|cp=(2|4) (zig-zag|ring), hopper)" $OUT/cp_${i}_$v.txt | cut -c1-150 >> $OUT/summary.txt
done
echo "total $((SECONDS-T0)) s" >> $OUT/summary.txt
cat $OUT/summary.txt
