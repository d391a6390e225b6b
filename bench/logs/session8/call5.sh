#!/usr/bin/env bash
# session 8, call 5: the merged quantisers (fp8-q: SwiGLU's FP8 backward in load rounds, the
# transposed quantiser's whole-patch path; fp8-block: the weight cache's BLOCK128 kernel) against
# the old kernels (same bench source, 0df772f's header); test_cuda (fp16 quantiser cases added)
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
C=.dev/c5; T0=$SECONDS
timeout 120 stdbuf -oL $C/new/test_cuda > $OUT/test_cuda.txt 2>&1; echo "test_cuda rc=$? $((SECONDS-T0)) s"; grep -E "FAIL" $OUT/test_cuda.txt | head -8; tail -1 $OUT/test_cuda.txt
for v in old new r2 old new r2; do timeout 60 stdbuf -oL $C/$v/bench_cuda --fp8-gemm > $OUT/fp8gemm_$v.txt 2>&1; done
for v in new r2; do timeout 30 stdbuf -oL $C/$v/bench_cuda --swiglu-bwd-fp8 > $OUT/swb_$v.txt 2>&1; done
echo "micro done $((SECONDS-T0)) s"
S="--preset 1b --steps 6 --warmup 2"
run() { timeout 90 stdbuf -oL $C/$2/bench_cuda $S $3 > $OUT/$1.txt 2>&1; echo "$1: $(grep -hE '^ultrascale' $OUT/$1.txt | cut -c1-100) ($((SECONDS-T0)) s)"; }
run bf16_new_1 new ""; run fp8_old_1 old "--precision fp8"; run fp8_new_1 new "--precision fp8"
run bf16_new_2 new ""; run fp8_old_2 old "--precision fp8"; run fp8_new_2 new "--precision fp8"
timeout 90 stdbuf -oL $C/new/bench_cuda --preset 1b --steps 3 --warmup 2 --precision fp8 --profile > $OUT/prof_fp8_new.txt 2>&1
echo "total $((SECONDS-T0)) s"
for v in old new r2; do echo "== $v"; grep -E "^\|" $OUT/fp8gemm_$v.txt | tail -8; grep -i swiglu $OUT/fp8gemm_$v.txt | tail -2; done
cat $OUT/swb_*.txt | grep -i "GB/s" | head -4
sed -n '/profile of one/,/total/p' $OUT/prof_fp8_new.txt
