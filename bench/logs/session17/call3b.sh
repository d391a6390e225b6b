#!/usr/bin/env bash
# session 17, call 3b (call 3's warm machine): the 1B step, bf16 and fp8 interleaved twice (s17c).
# As run, the log names lost the precision ($p_ was read as a variable): each log's model line
# says it; they ran bf16, fp8, bf16, fp8 (b1b_23694, b1b_10742, b1b_21172, b1b_31448)
export NCCL_NVLS_ENABLE=0; for p in bf16 fp8 bf16 fp8; do timeout 50 .dev/s17c/bench_cuda --preset 1b --steps 6 --warmup 2 --precision $p > $OUT/b1b_$p_$RANDOM.txt 2>&1; echo "$p rc=$? $(grep -hE '^ultrascale' $OUT/*.txt | tail -1 | cut -c1-120)"; done
