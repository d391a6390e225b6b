#!/usr/bin/env bash
# session 13, call 1: s13a = main 26f968d + the embedding backward in token order (sorted ids,
# one thread per column of an id's run, no atomics): test_cuda (the CPU's bits for the embedding
# backward among the op checks); two default train_cuda runs, whose checkpoints must be the same
# bits; FP8 against bf16 (issue 23, item 4): bench_cuda --preset 1b twice and 8b8 once,
# interleaved pairs; bench/fp8_widths.sh (the 12-layer model at widths 768..3072) with the size rule
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
N=.dev/s13a; T0=$SECONDS
timeout 130 $N/test_cuda > $OUT/test_cuda.txt 2>&1; echo "test_cuda rc=$? $((SECONDS-T0)) s" > $OUT/summary.txt
grep -E "FAIL" $OUT/test_cuda.txt | head -8 >> $OUT/summary.txt; tail -1 $OUT/test_cuda.txt >> $OUT/summary.txt
for r in D E; do timeout 30 $N/train_cuda --steps 6 --save /tmp/r$r > $OUT/train_$r.txt 2>&1; echo "train $r rc=$?" >> $OUT/summary.txt; done
s=0; d=0; for f in $(cd /tmp/rD && find . -name '*.safetensors'); do if cmp -s /tmp/rD/$f /tmp/rE/$f; then s=$((s+1)); else d=$((d+1)); fi; done
echo "D vs E safetensors: $s the same, $d differ" >> $OUT/summary.txt; grep -h "^step +6 " $OUT/train_[DE].txt | cut -c1-70 >> $OUT/summary.txt
for i in 1 2; do for p in bf16 fp8; do
  timeout 60 $N/bench_cuda --preset 1b --steps 6 --warmup 2 --precision $p > $OUT/b1b_${p}_$i.txt 2>&1
  echo "1b $p #$i rc=$? $((SECONDS-T0)) s: $(grep -E '^ultrascale ' $OUT/b1b_${p}_$i.txt | tail -1 | tr '\n' ' ')" >> $OUT/summary.txt
done; done
for p in bf16 fp8; do
  timeout 80 $N/bench_cuda --preset 8b8 --steps 6 --warmup 2 --precision $p > $OUT/b8b8_$p.txt 2>&1
  echo "8b8 $p rc=$? $((SECONDS-T0)) s: $(grep -E '^ultrascale ' $OUT/b8b8_$p.txt | tail -1 | tr '\n' ' ')" >> $OUT/summary.txt
done
timeout 150 bash bench/fp8_widths.sh .dev/tinyshakespeare.txt $N/train_cuda > $OUT/fp8_widths.txt 2>&1; echo "fp8_widths rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
cat $OUT/fp8_widths.txt >> $OUT/summary.txt
grep -h "fp8\|FP8" $OUT/b1b_fp8_1.txt | head -3 >> $OUT/summary.txt
echo "total $((SECONDS-T0)) s" >> $OUT/summary.txt
cat $OUT/summary.txt
