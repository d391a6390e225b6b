#!/usr/bin/env bash
# session 24, call 6 (s24d = bench_cuda with --fp8-stale-quant): the 1B fp8 step as it is, with
# every quantisation skipped (--fp8-free-quant), and with the quantisers running into a buffer no
# GEMM reads (--fp8-stale-quant): is call 5's 18 ms the quantisers' time, or the stale operands'?
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
tar xzf .dev/c4.tgz -C .dev
T0=$SECONDS; S=$OUT/summary.txt; B=.dev/s24d/bench_cuda
st() { timeout 40 $B --preset 1b --steps 6 --warmup 2 --precision fp8 "$@" 2>&1 | grep -E '^ultrascale' | cut -c1-100; }
echo "1b fp8: $(st)" >> $S
echo "1b fp8 stale-quant: $(st --fp8-stale-quant)" >> $S
echo "1b fp8 free-quant: $(st --fp8-free-quant)" >> $S
echo "1b fp8 stale-quant: $(st --fp8-stale-quant)" >> $S
echo "total $((SECONDS-T0)) s" >> $S
cat $S
