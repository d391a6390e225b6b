#!/usr/bin/env bash
# session 20, call 5 (s20e = the session's library): for the next session, Nsight Compute source
# counters on the HS 64 block forward after the walk went a tile ahead (32/8/64, T 8192; the
# nineteenth session's call 6 has the same reading before it), and on the new SwiGLU FP8
# backward in the 1B fp8 step. Summaries by bench/logs/session19/ncu_src.py.
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
tar xzf .dev/c4.tgz
T0=$SECONDS; N=.dev/s20e
timeout 60 ncu --set full --import-source no -k regex:us__hop_block_fwd_kernel -s 1 -c 1 -o $OUT/bfwd $N/bench_cuda --cp-seq 8192 --cp-heads 32:8:64 > $OUT/log_bfwd.txt 2>&1
echo "ncu block fwd rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
timeout 80 ncu --set full --import-source no -k regex:us__k_swiglu_bwd_fp8 -s 20 -c 1 -o $OUT/swb $N/bench_cuda --preset 1b --precision fp8 --steps 1 --warmup 2 > $OUT/log_swb.txt 2>&1
echo "ncu swiglu_bwd_fp8 rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
for k in bfwd swb; do
  [ -f $OUT/$k.ncu-rep ] || continue
  ncu -i $OUT/$k.ncu-rep --page source --csv --print-source sass > $OUT/src.csv 2>> $OUT/summary.txt
  python3 bench/logs/session19/ncu_src.py $OUT/src.csv 60 > $OUT/src_$k.txt 2>&1
  ncu -i $OUT/$k.ncu-rep --page details >> $OUT/src_$k.txt 2>&1
  head -4 $OUT/src_$k.txt | cut -c1-200 >> $OUT/summary.txt
  rm -f $OUT/$k.ncu-rep $OUT/src.csv
done
rm -f $OUT/log_*.txt
echo "total $((SECONDS-T0)) s" >> $OUT/summary.txt
cat $OUT/summary.txt
