#!/usr/bin/env bash
# session 20, call 2: s20b = base (012a506); s20c = s20a (call 1) with __fdividef in the SwiGLU
# backward (call 1's s20f) and the transposed FP8 quantiser (us__k_fp8_row_t) on a persistent
# grid with two cp.async stages. test_cuda (s20c); bench_cuda --fp8-gemm and --swiglu-bwd-fp8
# (b c, twice); --cp-seq at 16:8:128 (b c, twice: the walk a tile ahead); the 1B step fp8 b c and
# bf16 c, interleaved three times; 8b8 bf16 / fp8 at s20c
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
tar xzf .dev/c2.tgz
T0=$SECONDS
S=$OUT/summary.txt
timeout 150 .dev/s20c/test_cuda > $OUT/test_s20c.txt 2>&1
echo "test_cuda s20c rc=$? $((SECONDS-T0)) s: $(tail -1 $OUT/test_s20c.txt)" > $S
grep -E "FAIL" $OUT/test_s20c.txt | head -10 >> $S
for r in 1 2; do for v in s20b s20c; do
  timeout 90 .dev/$v/bench_cuda --fp8-gemm > $OUT/fp8g_${r}_$v.txt 2>&1
  echo "== fp8-gemm $v rc=$? $((SECONDS-T0)) s" >> $S
  grep -E "^\| [0-9]" $OUT/fp8g_${r}_$v.txt | awk -F'|' '{print $2 "|" $8}' >> $S
  echo "swb $v: $(timeout 60 .dev/$v/bench_cuda --swiglu-bwd-fp8 2>&1 | grep -E '^swiglu_bwd_fp8' | sed 's/ (bytes.*//' | tr '\n' ' ')" >> $S
done; done
for r in 1 2; do for v in s20b s20c; do
  timeout 60 .dev/$v/bench_cuda --cp-seq 8192,32768 --cp-heads 16:8:128 > $OUT/cp_${r}_$v.txt 2>&1
  echo "== cp $v rc=$? $((SECONDS-T0)) s: $(grep -E '^\| (causal|one block, positions.*hopper)' $OUT/cp_${r}_$v.txt | awk -F'|' '{print $3 "/" $4}' | tr '\n' ' ')" >> $S
done; done
for r in 1 2 3; do for vp in s20b:fp8 s20c:fp8 s20c:bf16; do
  v=${vp%:*}; p=${vp#*:}
  l=$(timeout 100 .dev/$v/bench_cuda --preset 1b --steps 6 --warmup 2 --precision $p 2>&1 | grep -E '^ultrascale' | cut -c1-100)
  echo "step $v $p: $l" >> $S
done; done
for p in bf16 fp8; do
  l=$(timeout 100 .dev/s20c/bench_cuda --preset 8b8 --steps 6 --warmup 2 --precision $p 2>&1 | grep -E '^ultrascale' | cut -c1-100)
  echo "step8b8 s20c $p: $l" >> $S
done
echo "total $((SECONDS-T0)) s" >> $S
cat $S
