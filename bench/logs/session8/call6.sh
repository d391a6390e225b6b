#!/usr/bin/env bash
# session 8, call 6: the session's final library: test_cuda; the 1B step against PyTorch eager and
# torch.compile (ours before and after), FP8 against bf16; attention against SDPA, same call
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
C=.dev/c6; T0=$SECONDS
timeout 120 stdbuf -oL $C/test_cuda > $OUT/test_cuda.txt 2>&1; echo "test_cuda rc=$? $((SECONDS-T0)) s"; grep -E "FAIL" $OUT/test_cuda.txt | head -5; tail -1 $OUT/test_cuda.txt
S="--preset 1b --steps 6 --warmup 2"
run() { timeout 90 stdbuf -oL $C/bench_cuda $S $2 > $OUT/$1.txt 2>&1; echo "$1: $(grep -hE '^ultrascale' $OUT/$1.txt | cut -c1-112) ($((SECONDS-T0)) s)"; }
run bf16_1 ""
timeout 120 python3 bench/torch_llama.py --preset 1b --steps 6 --warmup-steps 2 > $OUT/eager.txt 2>&1; echo "eager: $(grep -hE '^torch' $OUT/eager.txt | cut -c1-112) ($((SECONDS-T0)) s)"
timeout 200 python3 bench/torch_llama.py --preset 1b --steps 6 --warmup-steps 2 --compile > $OUT/compile.txt 2>&1; echo "compile: $(grep -hE '^torch' $OUT/compile.txt | cut -c1-130) ($((SECONDS-T0)) s)"
run bf16_2 ""; run fp8_1 "--precision fp8"; run bf16_3 ""; run fp8_2 "--precision fp8"
timeout 90 stdbuf -oL $C/bench_cuda --attention --att-heads 32:8:64,16:4:128 > $OUT/attn_us.txt 2>&1
timeout 120 python3 bench/sdpa_bench.py > $OUT/attn_sdpa.txt 2>&1
echo "total $((SECONDS-T0)) s"
grep -E "^\|" $OUT/attn_us.txt | head -20; grep -E "^\|" $OUT/attn_sdpa.txt | head -24
