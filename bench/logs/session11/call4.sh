#!/usr/bin/env bash
# session 11, call 4: the session's library (s11e: RMSNorm's backward in one pass, the GEMM
# tuner, the dK/dV pre-mask) — test_cuda, train_cuda --gemm-tune on the built-in task; the 1B
# step against main as the session began (s11a, 03c5e78), bf16 and fp8 interleaved, --gemm-tune,
# torch.compile; one profiled step of each for RMSNorm's line
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
N=.dev/s11e; P=.dev/s11a; T0=$SECONDS
timeout 200 stdbuf -oL $N/test_cuda > $OUT/test_cuda.txt 2>&1; echo "test_cuda rc=$? $((SECONDS-T0)) s" > $OUT/summary.txt
grep -E "FAIL" $OUT/test_cuda.txt | head -8 >> $OUT/summary.txt; tail -1 $OUT/test_cuda.txt >> $OUT/summary.txt
timeout 120 $N/train_cuda --gemm-tune --steps 8 > $OUT/train_tune.txt 2>&1; echo "train_cuda --gemm-tune rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
grep -E "gemm-tune|^step +(1|2|3|8) " $OUT/train_tune.txt | head -6 >> $OUT/summary.txt; tail -2 $OUT/train_tune.txt >> $OUT/summary.txt
S="--preset 1b --steps 6 --warmup 4"
run() { timeout 120 stdbuf -oL $3/bench_cuda $2 > $OUT/$1.txt 2>&1; echo "$1: $(grep -hE '^ultrascale|gemm-tune' $OUT/$1.txt | cut -c1-100 | tr '\n' ' ') ($((SECONDS-T0)) s)" >> $OUT/summary.txt; }
tl() { timeout 200 python3 bench/torch_llama.py $2 > $OUT/$1.txt 2>&1; echo "$1: $(grep -hE '^torch' $OUT/$1.txt | cut -c1-100) ($((SECONDS-T0)) s)" >> $OUT/summary.txt; }
run bf16_old "$S" $P
run bf16_new "$S" $N
run bf16_tune "$S --gemm-tune" $N
tl compile "--preset 1b --steps 6 --warmup-steps 2 --compile"
run fp8_old "$S --precision fp8" $P
run fp8_new "$S --precision fp8" $N
run fp8_old2 "$S --precision fp8" $P
run fp8_new2 "$S --precision fp8" $N
run prof_old "--preset 1b --steps 3 --warmup 2 --profile" $P
run prof_new "--preset 1b --steps 3 --warmup 2 --profile" $N
for f in prof_old prof_new; do echo "$f: $(grep -E '^    (gemm \(|attention|rmsnorm|swiglu|adamw|total)' $OUT/$f.txt | tr -s ' ' | tr '\n' ';')" >> $OUT/summary.txt; done
echo "total $((SECONDS-T0)) s" >> $OUT/summary.txt
cat $OUT/summary.txt
