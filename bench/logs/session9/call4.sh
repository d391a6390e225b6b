#!/usr/bin/env bash
# session 9, call 4: dQ frees its Q buffer early (s9d) against s9c; the final attention table against
# SDPA; the 200M preset against torch.compile; FP8 against bf16 at 8B width
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
N=.dev/s9d; P=.dev/s9c; T0=$SECONDS
timeout 200 stdbuf -oL $N/test_cuda > $OUT/test_cuda.txt 2>&1; echo "test_cuda rc=$? $((SECONDS-T0)) s"; grep -E "FAIL" $OUT/test_cuda.txt | head -5; tail -1 $OUT/test_cuda.txt
timeout 100 stdbuf -oL $P/bench_cuda --attention --att-heads 16:4:128 > $OUT/att_prev.txt 2>&1
timeout 150 stdbuf -oL $N/bench_cuda --attention --att-heads 32:8:64,16:4:128 > $OUT/att_new.txt 2>&1
timeout 100 python3 bench/sdpa_bench.py > $OUT/sdpa.txt 2>&1; echo "attention done $((SECONDS-T0)) s"
timeout 90 stdbuf -oL $N/bench_cuda --preset 200m --steps 10 --warmup 3 > $OUT/s200m.txt 2>&1; echo "200m: $(grep -hE '^ultrascale' $OUT/s200m.txt | cut -c1-100) ($((SECONDS-T0)) s)"
timeout 200 python3 bench/torch_llama.py --preset 200m --steps 10 --warmup-steps 3 --compile > $OUT/c200m.txt 2>&1; echo "compile 200m: $(grep -hE '^torch' $OUT/c200m.txt | cut -c1-100) ($((SECONDS-T0)) s)"
for p in bf16 fp8; do timeout 120 stdbuf -oL $N/bench_cuda --preset 8b8 --steps 6 --warmup 2 --precision $p > $OUT/b8_$p.txt 2>&1; echo "8b8 $p: $(grep -hE '^ultrascale' $OUT/b8_$p.txt | cut -c1-100) ($((SECONDS-T0)) s)"; done
echo "total $((SECONDS-T0)) s"
for f in prev new; do echo "== $f"; grep -E "^us-hop " $OUT/att_$f.txt; done
grep -E "^cudnn|^flash" $OUT/sdpa.txt
