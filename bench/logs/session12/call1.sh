#!/usr/bin/env bash
# session 12, call 1: the library at 40f22a0 (s12a; de49588's host changes first run on a GPU):
# test_cuda, then the whole of bench/run_gpu.sh (the step against eager and torch.compile,
# default and --gemm-tune, attention against SDPA, CP, gemm_steps) in this one call
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
N=.dev/s12a; T0=$SECONDS
timeout 100 $N/test_cuda > $OUT/test_cuda.txt 2>&1; echo "test_cuda rc=$? $((SECONDS-T0)) s" > $OUT/summary.txt
grep -E "FAIL" $OUT/test_cuda.txt | head -6 >> $OUT/summary.txt; tail -1 $OUT/test_cuda.txt >> $OUT/summary.txt
mkdir -p $OUT/run
B=$N OUT=$OUT/run timeout 470 bash bench/run_gpu.sh > $OUT/run_gpu.txt 2>&1; echo "run_gpu rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
tar czf $OUT/run_logs.tgz -C $OUT run && rm -rf $OUT/run
sed -n '/=== summary/,$p' $OUT/run_gpu.txt >> $OUT/summary.txt
cat $OUT/summary.txt
