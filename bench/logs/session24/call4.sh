#!/usr/bin/env bash
# session 24, call 4 (s24c = e77e1c4's bench_cuda and libus_attn.so):
# (1) 8b8 fp8 against bf16 with the optimizer over 4 micro-batches (--accum 4), interleaved twice:
#     the ratio when AdamW (the same 25 ms in both) is paid once per 4 micro-batches;
# (2) attention at the 1B shape (32/8/64), T 4k and 8k, ours (default: the two-kernel backward)
#     against ours with dS through memory (mode 7) and SDPA's cuDNN backend, one process, ten
#     calls a sample (the GPU at its power limit, as in a step).
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
tar xzf .dev/c3.tgz -C .dev
T0=$SECONDS; S=$OUT/summary.txt; B=.dev/s24c/bench_cuda
st() { timeout 120 $B --steps 4 --warmup 2 "$@" 2>&1 | grep -E '^ultrascale' | cut -c1-112; }
for r in 1 2; do
  echo "8b8 accum4 fp8: $(st --preset 8b8 --accum 4 --precision fp8)" >> $S
  echo "8b8 accum4 bf16: $(st --preset 8b8 --accum 4 --precision bf16)" >> $S
done
echo "elapsed $((SECONDS-T0)) s" >> $S
timeout 200 python3 bench/attn_ab.py --lib .dev/s24c/libus_attn.so --lib-b .dev/s24c/libus_attn_b.so \
  --mode-b 7 --batch 10 --att-heads 32:8:64 --att-seq 4096,8192 > $OUT/attn_ab_mode7.txt 2>&1
tail -12 $OUT/attn_ab_mode7.txt >> $S
echo "total $((SECONDS-T0)) s" >> $S
cat $S
