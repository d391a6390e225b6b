#!/usr/bin/env bash
# session 19, call 6 (s19g = the final kernels): for the next session, Nsight Compute source
# counters on what is left: the block forward at HS 64 (still 1.13x the causal one at T 32k)
# beside the causal one, 32/8/64 at T 8192; and the FP8 step's SwiGLU backward with both
# tilings (2.5 TB/s). Summaries by bench/logs/session19/ncu_src.py.
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
tar xzf .dev/c6.tgz
T0=$SECONDS; N=.dev/s19g
for k in us__hop_fwd_kernel us__hop_block_fwd_kernel; do
  timeout 100 ncu --set full --import-source no -k regex:$k -s 1 -c 1 -o $OUT/$k $N/bench_cuda --cp-seq 8192 --cp-heads 32:8:64 > $OUT/log_$k.txt 2>&1
  echo "ncu $k rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt; tail -2 $OUT/log_$k.txt >> $OUT/summary.txt
done
timeout 120 ncu --set full --import-source no -k regex:us__k_swiglu_bwd_fp8 -s 20 -c 1 -o $OUT/swb $N/bench_cuda --preset 1b --precision fp8 --steps 1 --warmup 2 > $OUT/log_swb.txt 2>&1
echo "ncu swiglu_bwd_fp8 rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt; tail -2 $OUT/log_swb.txt >> $OUT/summary.txt
for k in us__hop_fwd_kernel us__hop_block_fwd_kernel swb; do
  ncu -i $OUT/$k.ncu-rep --page source --csv --print-source sass > $OUT/src.csv 2>> $OUT/summary.txt
  python3 bench/logs/session19/ncu_src.py $OUT/src.csv 60 > $OUT/src_$k.txt 2>&1
  ncu -i $OUT/$k.ncu-rep --page details >> $OUT/src_$k.txt 2>&1
  head -4 $OUT/src_$k.txt | cut -c1-200 >> $OUT/summary.txt
  rm -f $OUT/$k.ncu-rep $OUT/src.csv
done
rm -f $OUT/log_*.txt
echo "total $((SECONDS-T0)) s" >> $OUT/summary.txt
cat $OUT/summary.txt
