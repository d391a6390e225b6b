#!/usr/bin/env bash
# session 13, call 2: s13b = the persistent dK/dV kernel (K/V double-buffered, the Q/dO ring and
# the consumers' turns carried from key block to key block) against s13a (4132812, the grid of
# one CTA per key block): test_cuda of s13b; attn_ab.py with both libraries and cuDNN rep by rep
# (one process); bench_cuda --attention at the other head sizes, and the 1B step, s13a and s13b
# interleaved
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
N=.dev/s13b; O=.dev/s13a; T0=$SECONDS
timeout 130 $N/test_cuda > $OUT/test_cuda.txt 2>&1; echo "test_cuda rc=$? $((SECONDS-T0)) s" > $OUT/summary.txt
grep -E "FAIL" $OUT/test_cuda.txt | head -8 >> $OUT/summary.txt; tail -1 $OUT/test_cuda.txt >> $OUT/summary.txt
H=16:16:128,32:32:64,16:4:128,32:8:64; S=1024,2048,4096,8192
timeout 150 python3 bench/attn_ab.py --lib $N/libus_attn.so --lib-b $O/libus_attn.so --att-heads $H --att-seq $S > $OUT/ab.txt 2>&1; echo "attn_ab rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
for i in 1 2; do for b in $O $N; do
  timeout 60 $b/bench_cuda --attention --att-heads 16:8:96,16:16:80,8:8:192,8:4:256 --att-seq 4096 > $OUT/att_$(basename $b)_$i.txt 2>&1
  echo "attention $(basename $b) #$i rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
done; done
for i in 1 2; do for b in $O $N; do
  timeout 60 $b/bench_cuda --preset 1b --steps 6 --warmup 2 > $OUT/b1b_$(basename $b)_$i.txt 2>&1
  echo "1b $(basename $b) #$i rc=$? $((SECONDS-T0)) s: $(grep -E '^ultrascale ' $OUT/b1b_$(basename $b)_$i.txt | cut -c1-75)" >> $OUT/summary.txt
done; done
(for f in $OUT/att_*.txt; do echo "== $f"; grep -E "^us-hop " $f; done) > $OUT/att_all.txt; rm -f $OUT/att_s13*.txt
cat $OUT/att_all.txt >> $OUT/summary.txt
sed -n '/one process/,$p' $OUT/ab.txt >> $OUT/summary.txt
echo "total $((SECONDS-T0)) s" >> $OUT/summary.txt
cat $OUT/summary.txt
