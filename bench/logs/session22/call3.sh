#!/usr/bin/env bash
# session 22, call 3: the whole bench/run_gpu.sh at s22c (the session's library): the step against
# eager and torch.compile (1b, 200m; default and --gemm-tune), attention against SDPA, attn_ab
# with 1 and 10 calls a sample, CP, gemm_steps
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
tar xzf .dev/c3.tgz
T0=$SECONDS; N=.dev/s22c
mkdir -p $OUT/run
B=$N OUT=$OUT/run timeout 500 bash bench/run_gpu.sh > $OUT/run_gpu.txt 2>&1; echo "run_gpu rc=$? $((SECONDS-T0)) s" > $OUT/summary.txt
tar czf $OUT/run_logs.tgz -C $OUT run && rm -rf $OUT/run
sed -n '/=== summary/,$p' $OUT/run_gpu.txt >> $OUT/summary.txt
echo "total $((SECONDS-T0)) s" >> $OUT/summary.txt
cat $OUT/summary.txt
