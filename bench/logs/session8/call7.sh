#!/usr/bin/env bash
# session 8, call 7: the planner's rates on this H200 (bench/calibrate, one GPU); the 200M preset
# against torch.compile, same call
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
C=.dev/c7; T0=$SECONDS
timeout 150 stdbuf -oL $C/calibrate --out $OUT/rates_1gpu.txt > $OUT/calibrate.txt 2>&1; echo "calibrate rc=$? $((SECONDS-T0)) s"; cat $OUT/rates_1gpu.txt
timeout 60 stdbuf -oL $C/bench_cuda --preset 200m --steps 10 --warmup 3 > $OUT/200m_us.txt 2>&1; echo "$(grep -hE '^ultrascale' $OUT/200m_us.txt | cut -c1-110) ($((SECONDS-T0)) s)"
timeout 200 python3 bench/torch_llama.py --preset 200m --steps 10 --warmup-steps 3 --compile > $OUT/200m_compile.txt 2>&1; echo "$(grep -hE '^torch' $OUT/200m_compile.txt | cut -c1-130) ($((SECONDS-T0)) s)"
timeout 60 stdbuf -oL $C/bench_cuda --preset 200m --steps 10 --warmup 3 > $OUT/200m_us2.txt 2>&1; echo "$(grep -hE '^ultrascale' $OUT/200m_us2.txt | cut -c1-110) ($((SECONDS-T0)) s)"
echo "total $((SECONDS-T0)) s"
