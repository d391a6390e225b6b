#!/usr/bin/env bash
# session 7, call 4: the Hopper attention kernels shared between causal and CP blocks (branch
# dedupe, 4a9b65a): test_cuda, then attention and CP block timings, main and dedupe alternating
# .dev/s7c: binaries of 1b8530a (main); .dev/dedupe: of 4a9b65a (branch dedupe); both built on the VM (sm_90a)
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
M=.dev/s7c; D=.dev/dedupe; T0=$SECONDS
timeout 150 stdbuf -oL $D/test_cuda > $OUT/test_cuda.txt 2>&1; echo "test_cuda rc=$? $((SECONDS-T0)) s"; tail -1 $OUT/test_cuda.txt
timeout 100 stdbuf -oL $D/test_cuda --attn-blocks > $OUT/test_attn_blocks.txt 2>&1; echo "attn-blocks rc=$? $((SECONDS-T0)) s"; tail -1 $OUT/test_attn_blocks.txt
for r in 1 2; do for b in M D; do eval X=\$$b
timeout 60 stdbuf -oL $X/bench_cuda --attention --att-seq 4096,8192 --att-heads 16:4:128,32:8:64 > $OUT/att_${b}$r.txt 2>&1; echo "att $b$r rc=$? $((SECONDS-T0)) s"
done; done
for b in M D; do eval X=\$$b
timeout 60 stdbuf -oL $X/bench_cuda --cp-seq 32768 > $OUT/cp_${b}.txt 2>&1; echo "cp $b rc=$? $((SECONDS-T0)) s"
done
for f in att_M1 att_D1 att_M2 att_D2; do echo "== $f"; grep -E "us-" $OUT/$f.txt | head -12; done
for f in cp_M cp_D; do echo "== $f"; grep -iE "hopper|one block|slowest" $OUT/$f.txt | head -12; done
