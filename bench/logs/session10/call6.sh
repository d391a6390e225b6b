#!/usr/bin/env bash
# session 10, call 6: the planner's rates at the final kernels (calibrate, 1 GPU); the 1B step
# (30c6c47) against torch.compile once more
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
N=.dev/s10c; T0=$SECONDS
timeout 70 stdbuf -oL $N/calibrate --out $OUT/rates_1gpu.txt > $OUT/calibrate.txt 2>&1; echo "calibrate rc=$? $((SECONDS-T0)) s"; tail -3 $OUT/calibrate.txt
S="--preset 1b --steps 6 --warmup 2"
timeout 90 stdbuf -oL $N/bench_cuda $S > $OUT/bf16_1.txt 2>&1; echo "bf16_1: $(grep -hE '^ultrascale' $OUT/bf16_1.txt | cut -c1-110) ($((SECONDS-T0)) s)"
timeout 150 python3 bench/torch_llama.py --preset 1b --steps 6 --warmup-steps 2 --compile > $OUT/compile.txt 2>&1; echo "compile: $(grep -hE '^torch' $OUT/compile.txt | cut -c1-110) ($((SECONDS-T0)) s)"
timeout 90 stdbuf -oL $N/bench_cuda $S > $OUT/bf16_2.txt 2>&1; echo "bf16_2: $(grep -hE '^ultrascale' $OUT/bf16_2.txt | cut -c1-110) ($((SECONDS-T0)) s)"
echo "total $((SECONDS-T0)) s"
