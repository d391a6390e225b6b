#!/usr/bin/env bash
# session 13, call 7: s13d = main at the session's end (persistent dK/dV, the embedding backward in
# token order): test_cuda; two train_cuda runs reading one GEMM tune file (same bits expected
# now that the embedding backward is deterministic); the whole bench/run_gpu.sh (the step against
# eager and torch.compile, attention against SDPA, attn_ab with 1 and 10 calls a sample, CP,
# gemm_steps); the 8b8 fp8 step's profile (where FP8's time goes)
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
N=.dev/s13d; T0=$SECONDS
timeout 100 $N/test_cuda > $OUT/test_cuda.txt 2>&1; echo "test_cuda rc=$? $((SECONDS-T0)) s" > $OUT/summary.txt
grep -E "FAIL" $OUT/test_cuda.txt | head -6 >> $OUT/summary.txt; tail -1 $OUT/test_cuda.txt >> $OUT/summary.txt
TF=/tmp/tune.txt; rm -rf $TF /tmp/r[ABC]
for r in A B C; do timeout 40 $N/train_cuda --gemm-tune-file $TF --steps 6 --save /tmp/r$r > /tmp/train_$r.txt 2>&1; echo "train $r rc=$?" >> $OUT/summary.txt; done
s=0; d=0; for f in $(cd /tmp/rB && find . -name '*.safetensors'); do if cmp -s /tmp/rB/$f /tmp/rC/$f; then s=$((s+1)); else d=$((d+1)); fi; done
echo "tune-file runs B vs C safetensors: $s the same, $d differ" >> $OUT/summary.txt
mkdir -p $OUT/run
B=$N OUT=$OUT/run timeout 450 bash bench/run_gpu.sh > $OUT/run_gpu.txt 2>&1; echo "run_gpu rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
timeout 40 $N/bench_cuda --preset 8b8 --precision fp8 --steps 4 --warmup 2 --profile > $OUT/run/fp8_8b8_profile.txt 2>&1; echo "8b8 fp8 profile rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
tar czf $OUT/run_logs.tgz -C $OUT run && rm -rf $OUT/run
sed -n '/=== summary/,$p' $OUT/run_gpu.txt >> $OUT/summary.txt
echo "total $((SECONDS-T0)) s" >> $OUT/summary.txt
cat $OUT/summary.txt
