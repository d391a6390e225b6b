#!/usr/bin/env bash
# session 20, call 1: s20b = base (012a506) ; s20a = the SwiGLU FP8 backward staged by cp.async
# (512 threads, two halves quantising gate and up side by side) and the block kernels' copy
# thread walking a tile ahead ; s20f = s20a with sigmoid's 1/x as __fdividef.
# test_cuda (s20a); bench_cuda --swiglu-bwd-fp8 (b a f, twice); --cp-seq (b a);
# the 1B step fp8 b a f and bf16 a, interleaved twice
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
tar xzf .dev/c1.tgz
T0=$SECONDS
S=$OUT/summary.txt
timeout 150 .dev/s20a/test_cuda > $OUT/test_s20a.txt 2>&1
echo "test_cuda s20a rc=$? $((SECONDS-T0)) s: $(tail -1 $OUT/test_s20a.txt)" > $S
grep -E "FAIL" $OUT/test_s20a.txt | head -10 >> $S
for r in 1 2; do for v in s20b s20a s20f; do
  echo "swb $v: $(timeout 60 .dev/$v/bench_cuda --swiglu-bwd-fp8 2>&1 | grep -E '^swiglu_bwd_fp8' | sed 's/ (bytes.*//' | tr '\n' ' ')" >> $S
done; done
for v in s20b s20a; do
  timeout 100 .dev/$v/bench_cuda --cp-seq 8192,32768 > $OUT/cp_$v.txt 2>&1
  echo "== cp $v rc=$? $((SECONDS-T0)) s" >> $S
  grep -E "^\| (one layer|causal|one block, positions.*hopper|cp=(2|4) zig-zag, hopper)" $OUT/cp_$v.txt | cut -c1-130 >> $S
done
for r in 1 2; do for vp in s20b:fp8 s20a:fp8 s20f:fp8 s20a:bf16; do
  v=${vp%:*}; p=${vp#*:}
  l=$(timeout 100 .dev/$v/bench_cuda --preset 1b --steps 6 --warmup 2 --precision $p 2>&1 | grep -E '^ultrascale' | cut -c1-110)
  echo "step $v $p: $l" >> $S
done; done
echo "total $((SECONDS-T0)) s" >> $S
cat $S
