#!/usr/bin/env bash
# session 24, call 5 (s24c's bench_cuda = e77e1c4): the FP8 recipe's ceiling today,
# --fp8-free-quant (every quantisation skipped in the timed steps: the step FP8 would give if
# quantising cost nothing) beside fp8 and bf16, interleaved: 8b8 twice, 8b8 --accum 4 once, 1B once.
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
tar xzf .dev/c3.tgz -C .dev
T0=$SECONDS; S=$OUT/summary.txt; B=.dev/s24c/bench_cuda
st() { timeout 120 $B --warmup 2 "$@" 2>&1 | grep -E '^ultrascale' | cut -c1-100; }
for r in 1 2; do
  echo "8b8 fp8: $(st --preset 8b8 --steps 6 --precision fp8)" >> $S
  echo "8b8 fp8 free-quant: $(st --preset 8b8 --steps 6 --precision fp8 --fp8-free-quant)" >> $S
  echo "8b8 bf16: $(st --preset 8b8 --steps 6 --precision bf16)" >> $S
done
echo "8b8 accum4 fp8 free-quant: $(st --preset 8b8 --steps 4 --accum 4 --precision fp8 --fp8-free-quant)" >> $S
echo "1b fp8: $(st --preset 1b --steps 6 --precision fp8)" >> $S
echo "1b fp8 free-quant: $(st --preset 1b --steps 6 --precision fp8 --fp8-free-quant)" >> $S
echo "1b bf16: $(st --preset 1b --steps 6 --precision bf16)" >> $S
echo "total $((SECONDS-T0)) s" >> $S
cat $S
