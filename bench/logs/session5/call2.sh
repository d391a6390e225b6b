#!/usr/bin/env bash
# session 5, call 2: the final main's test_cuda; MoE with FP8 experts; 8b8 fp8/bf16; 200m vs compile
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
B=.dev/bin
t0=$SECONDS
timeout 120 stdbuf -oL $B/test_cuda > $OUT/test_cuda.txt 2>&1; echo "test_cuda rc=$? ($((SECONDS-t0)) s)"
grep -E "FAIL" $OUT/test_cuda.txt | head -10; tail -n 1 $OUT/test_cuda.txt
for p in bf16 fp8 bf16 fp8; do
  timeout 50 stdbuf -oL $B/bench_cuda --preset moe --steps 6 --warmup 2 --precision $p >> $OUT/moe_fp8.txt 2>&1
done
echo "moe done ($((SECONDS-t0)) s)"
for p in bf16 fp8; do
  timeout 90 stdbuf -oL $B/bench_cuda --preset 8b8 --steps 6 --warmup 2 --precision $p >> $OUT/8b8.txt 2>&1
done
echo "8b8 done ($((SECONDS-t0)) s)"
timeout 40 stdbuf -oL $B/bench_cuda --preset 200m --steps 10 --warmup 3 > $OUT/200m_us.txt 2>&1
timeout 120 python3 bench/torch_llama.py --preset 200m --steps 10 --warmup-steps 3 --compile > $OUT/200m_compile.txt 2>&1
echo "=== done $((SECONDS-t0)) s"
grep -hE "^ultrascale|^torch" $OUT/moe_fp8.txt $OUT/8b8.txt $OUT/200m_us.txt $OUT/200m_compile.txt | cut -c1-170
