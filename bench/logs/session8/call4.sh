#!/usr/bin/env bash
# session 8, call 4: test_cuda with the GEMM tuner; the 1B step default vs --gemm-tune, torch.compile between
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
B=.dev/c4; T0=$SECONDS
timeout 120 stdbuf -oL $B/test_cuda > $OUT/test_cuda.txt 2>&1; echo "test_cuda rc=$? $((SECONDS-T0)) s"; grep -E "FAIL|tuned|tuning" $OUT/test_cuda.txt | head -8; tail -1 $OUT/test_cuda.txt
S="--preset 1b --steps 6 --warmup 2"
run() { timeout 90 stdbuf -oL $B/bench_cuda $S $2 > $OUT/$1.txt 2>&1; echo "$1: $(grep -hE '^ultrascale' $OUT/$1.txt | cut -c1-112) ($((SECONDS-T0)) s)"; }
run bf16_1 ""; run tune_1 "--gemm-tune"
timeout 200 python3 bench/torch_llama.py --preset 1b --steps 6 --warmup-steps 2 --compile > $OUT/compile.txt 2>&1; echo "compile rc=$? $(grep -hE '^torch' $OUT/compile.txt | cut -c1-120) ($((SECONDS-T0)) s)"
run bf16_2 ""; run tune_2 "--gemm-tune"
run fp8_1 "--precision fp8"; run fp8tune_1 "--precision fp8 --gemm-tune"
echo "total $((SECONDS-T0)) s"
