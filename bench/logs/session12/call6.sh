#!/usr/bin/env bash
# session 12, call 6 (call 5's start was refused): s12e = the final band rule (bench_cuda and
# libus_attn.so of b55f14f) and the GEMM tune file (test_cuda, train_cuda): test_cuda; train_cuda
# --gemm-tune-file three times (the first tunes and saves, the next two read: their checkpoints
# must be the same bits) and once with a broken file (refused); then bench_cuda --attention at
# multi-head and GQA shapes, T 1k-8k: bench/attn_ab.py (ours and SDPA's cuDNN backend in one
# process, rep by rep), then bench_cuda --attention (us-hop1b: one band) as time allows
# (sdpa_bench.py left out: three starts refused, little device time left)
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
N=.dev/s12e; T0=$SECONDS
H=16:16:128,32:32:64,16:4:128,32:8:64; S=1024,2048,4096,8192
timeout 100 $N/test_cuda > $OUT/test_cuda.txt 2>&1; echo "test_cuda rc=$? $((SECONDS-T0)) s" > $OUT/summary.txt
grep -E "FAIL" $OUT/test_cuda.txt | head -8 >> $OUT/summary.txt; tail -1 $OUT/test_cuda.txt >> $OUT/summary.txt
TF=/tmp/tune.txt; rm -rf $TF /tmp/r[ABC]
for r in A B C; do
  timeout 60 $N/train_cuda --gemm-tune-file $TF --steps 6 --save /tmp/r$r > /tmp/train_$r.txt 2>&1
  echo "train $r rc=$? $((SECONDS-T0)) s: $(grep -h gemm-tune /tmp/train_$r.txt | tr '\n' ' ')" >> $OUT/summary.txt
  grep -E "^step +6 " /tmp/train_$r.txt | cut -c1-60 >> $OUT/summary.txt
  (echo "=== run $r"; cat /tmp/train_$r.txt) >> $OUT/train.txt
done
cp $TF $OUT/tune.txt
same=0; diff=0
for f in $(cd /tmp/rB && find . -name '*.safetensors'); do if cmp -s /tmp/rB/$f /tmp/rC/$f; then same=$((same+1)); else diff=$((diff+1)); fi; done
echo "B vs C safetensors: $same the same, $diff differ; A vs B model: $(cmp -s $(find /tmp/rA -name model.safetensors | head -1) $(find /tmp/rB -name model.safetensors | head -1) && echo same || echo differ)" >> $OUT/summary.txt
sed 's/^device .*/device Other_GPU 1/' $TF > /tmp/bad.txt
timeout 60 $N/train_cuda --gemm-tune-file /tmp/bad.txt --steps 2 > /tmp/train_bad.txt 2>&1; echo "train with another GPU's file rc=$?: $(grep -h gemm-tune-file /tmp/train_bad.txt | head -1)" >> $OUT/summary.txt
(echo "=== another GPU's file"; cat /tmp/train_bad.txt) >> $OUT/train.txt
timeout ${AB_S:-150} python3 bench/attn_ab.py --lib $N/libus_attn.so --att-heads $H --att-seq $S > $OUT/ab.txt 2>&1; echo "attn_ab rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
if [ "${ATT_S:-120}" -gt 0 ]; then
  timeout ${ATT_S:-120} $N/bench_cuda --attention --att-heads $H --att-seq $S > $OUT/att.txt 2>&1; echo "attention rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
  grep -E "^us-hop |^us-hop1b" $OUT/att.txt >> $OUT/summary.txt
fi
sed -n '/one process/,$p' $OUT/ab.txt >> $OUT/summary.txt; tail -3 $OUT/ab.txt >> $OUT/summary.txt
echo "total $((SECONDS-T0)) s" >> $OUT/summary.txt
cat $OUT/summary.txt
