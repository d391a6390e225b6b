#!/usr/bin/env bash
# session 7, call 5: the merged library (ee73c00: grouped Wgrad on the kernel, the CP block kernels
# on the causal kernels' code, SwiGLU's backward writing dgu's FP8 operands): test_cuda; the 1B
# step bf16 / fp8 / fp8 --fp8-no-fuse interleaved twice, one fp8 profile (torch.compile left out: device time)
# .dev/fin: binaries of ee73c00 built on the VM (nvcc 13.0, sm_90a). A first try of this call lost the
# machine mid-run (taken back; no output); this is the second, shortened.
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
B=.dev/fin; T0=$SECONDS
timeout 150 stdbuf -oL $B/test_cuda > $OUT/test_cuda.txt 2>&1; echo "test_cuda rc=$? $((SECONDS-T0)) s"; grep FAIL $OUT/test_cuda.txt | head -5; tail -1 $OUT/test_cuda.txt
S="--preset 1b --steps 6 --warmup 2"
for r in 1 2; do for p in bf16 fp8 nofuse; do
  a="--precision $p"; [ $p = nofuse ] && a="--precision fp8 --fp8-no-fuse"
  timeout 60 stdbuf -oL $B/bench_cuda $S $a > $OUT/step_${p}_$r.txt 2>&1
  echo "$p $r: $(grep -hE '^ultrascale' $OUT/step_${p}_$r.txt | cut -c1-150)"
done; done
timeout 60 stdbuf -oL $B/bench_cuda $S --precision fp8 --profile > $OUT/prof_fp8.txt 2>&1; echo "prof rc=$? $((SECONDS-T0)) s"
echo "total $((SECONDS-T0)) s"
grep -A32 "profile of one step" $OUT/prof_fp8.txt | head -34
