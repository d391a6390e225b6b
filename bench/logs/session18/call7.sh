#!/usr/bin/env bash
# session 18, call 7: bench_cuda --cp-flash-only (every head size at T 4096), s18c (before) and
# s18d (the block backward with dS through memory at HS 96 and 128)
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
tar xzf .dev/c6.tgz
T0=$SECONDS
for v in s18c s18d; do
  timeout 90 .dev/$v/bench_cuda --cp-flash-only > $OUT/cpf_$v.txt 2>&1
  echo "cp-flash-only $v rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
done
for v in s18c s18d; do echo "== $v" >> $OUT/summary.txt; grep -E "^\| (causal|one block, positions.*hopper|cp=2 zig-zag, hopper|cp=4 zig-zag, hopper)" $OUT/cpf_$v.txt | cut -c1-130 >> $OUT/summary.txt; done
cat $OUT/summary.txt
