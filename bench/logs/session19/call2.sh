#!/usr/bin/env bash
# session 19, call 2 (s19a as call 1): Nsight Compute with source counters on the causal
# forward and one block's forward at 16/8/128, T 8192 (where the block kernel loses its 17 %),
# and the FP8 step's memory-bound kernels at 1B (SwiGLU backward with both tilings, the
# quantisers, the fused norm and SwiGLU forward): their DRAM rate and stalls
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
tar xzf .dev/c1.tgz
T0=$SECONDS; N=.dev/s19a
for k in us__hop_fwd_kernel us__hop_block_fwd_kernel; do
  timeout 150 ncu --set full --import-source no -k regex:$k -s 1 -c 1 -o $OUT/$k $N/bench_cuda --cp-seq 8192 --cp-heads 16:8:128 > $OUT/ncu_$k.log 2>&1
  echo "ncu $k rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
  ncu -i $OUT/$k.ncu-rep --page source --csv --print-source sass > $OUT/src_$k.csv 2> $OUT/src_$k.err
  echo "src $k rc=$? $(wc -c < $OUT/src_$k.csv) bytes $(head -c 300 $OUT/src_$k.err)" >> $OUT/summary.txt
  ncu -i $OUT/$k.ncu-rep --page details > $OUT/det_$k.txt 2>&1
done
K='regex:swiglu_bwd_fp8|fp8_row|fp8_block|rmsnorm.*fp8|swiglu_fwd_fp8|us__k_swiglu'
timeout 200 ncu --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats -k "$K" -s 150 -c 16 $N/bench_cuda --preset 1b --precision fp8 --steps 1 --warmup 2 > $OUT/ncu_fp8.txt 2>&1
echo "ncu fp8 rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Block Size|Grid Size|Stall|Warp Cycles Per Issued" $OUT/ncu_fp8.txt | cut -c1-140 >> $OUT/summary.txt
cd $OUT && tar czf rep.tgz *.ncu-rep src_*.csv det_*.txt && rm -f *.ncu-rep src_*.csv det_*.txt && cd - > /dev/null # (rep.tgz not kept: 5.5 MB; src_summary.txt and det_*.txt are extracts of it)
echo "total $((SECONDS-T0)) s" >> $OUT/summary.txt
cat $OUT/summary.txt
