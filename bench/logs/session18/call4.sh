#!/usr/bin/env bash
# session 18, call 4: Nsight Compute on cuDNN's SDPA backward at the 1B shape, T 8192 (its
# kernels' launch, occupancy and pipes), beside ours (s18c), for the next attempt at that shape
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
tar xzf .dev/c3.tgz
T0=$SECONDS; N=.dev/s18c
SEC="--section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats"
MET="--metrics regex:sm__pipe_.*_cycles_active\.avg\.pct_of_peak_sustained_active,regex:sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active"
timeout 200 ncu $SEC $MET -k regex:"bprop|dot_do|convert_dq|dgrad|backward|bwd" --launch-count 6 python3 bench/sdpa_bench.py --backends cudnn --att-heads 32:8:64 --att-seq 8192 > $OUT/ncu_cudnn.txt 2>&1
echo "ncu cudnn rc=$? $((SECONDS-T0)) s" > $OUT/summary.txt
timeout 120 ncu $SEC $MET -k regex:"us__hop_dkdv_kernel|us__hop_dq_kernel" --launch-count 2 $N/bench_cuda --attention --att-heads 32:8:64 --att-seq 8192 > $OUT/ncu_us.txt 2>&1
echo "ncu us rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
for f in ncu_cudnn ncu_us; do echo "== $f" >> $OUT/summary.txt; grep -E "^  [a-zA-Z_].*\(|Duration|Grid Size|Block Size|Registers Per|Dynamic Shared|Achieved Occupancy|Waves Per SM|Issue Slots Busy|pipe_(tensor|alu|fma|xu|lsu).*pct_of_peak_sustained_active +[1-9]" $OUT/$f.txt | cut -c1-150 >> $OUT/summary.txt; done
echo "total $((SECONDS-T0)) s" >> $OUT/summary.txt
cat $OUT/summary.txt
