#!/usr/bin/env bash
# session 6, call 3: the step against torch.compile at the final library (a7aaed6's kernels)
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
C=.dev/cp2; T0=$SECONDS
python3 -c 'import torch; print("torch", torch.__version__)'
timeout 40 stdbuf -oL $C/bench_cuda --preset 1b --steps 10 --warmup 3 > $OUT/1b_us.txt 2>&1
timeout 150 python3 bench/torch_llama.py --preset 1b --steps 10 --warmup-steps 3 --compile > $OUT/1b_compile.txt 2>&1; echo "compile rc=$? $((SECONDS-T0)) s"
timeout 40 stdbuf -oL $C/bench_cuda --preset 1b --steps 10 --warmup 3 > $OUT/1b_us2.txt 2>&1
echo "total $((SECONDS-T0)) s"
grep -hE "^ultrascale|^torch" $OUT/1b_us.txt $OUT/1b_compile.txt $OUT/1b_us2.txt | cut -c1-170
