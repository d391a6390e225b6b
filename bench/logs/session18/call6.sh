#!/usr/bin/env bash
# session 18, call 6: s18d = context parallelism's block backward with dS through memory where
# the causal one takes it (HS 96 and 128 by default): test_cuda; bench_cuda --cp-seq at T 8192
# and 32768, s18c (before) and s18d; then (call 5's, refused) fp8 against bf16 with --gemm-tune
# at 1B, interleaved twice
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
tar xzf .dev/c6.tgz
T0=$SECONDS; N=.dev/s18d
timeout 150 $N/test_cuda > $OUT/test_s18d.txt 2>&1
echo "test_cuda s18d rc=$? $((SECONDS-T0)) s: $(tail -1 $OUT/test_s18d.txt)" > $OUT/summary.txt
grep -E "FAIL" $OUT/test_s18d.txt | head -10 >> $OUT/summary.txt
for v in s18c s18d; do
  timeout 60 .dev/$v/bench_cuda --cp-seq 8192,32768 > $OUT/cp_$v.txt 2>&1
  echo "cp $v rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
done
for v in s18c s18d; do echo "== cp $v" >> $OUT/summary.txt; grep -E "^\| (causal|one block, positions.*hopper|cp=2 (zig-zag|ring), hopper|cp=4 zig-zag, hopper)|T = |^[a-z].*T=" $OUT/cp_$v.txt | cut -c1-150 >> $OUT/summary.txt; done
for i in 1 2; do for p in bf16 fp8; do
  timeout 80 $N/bench_cuda --preset 1b --precision $p --steps 6 --warmup 4 --gemm-tune > $OUT/t_${p}_$i.txt 2>&1
  echo "1b tuned $p #$i rc=$? $((SECONDS-T0)) s: $(grep -E '^ultrascale ' $OUT/t_${p}_$i.txt | cut -c1-110)" >> $OUT/summary.txt
done; done
echo "total $((SECONDS-T0)) s" >> $OUT/summary.txt
cd $OUT && tar czf runs.tgz t_*.txt && rm -f t_*.txt && cd - > /dev/null
cat $OUT/summary.txt
