#!/usr/bin/env bash
# session 17, call 1: s17a = main at 2f6d743 (the session's start; 544e04d's device code had not
# run on a GPU): test_cuda; the 1B step's profile; attn_ab at HS 64 against qr4 (s17a with the
# dQ kernel's Q and dO as register A fragments at HS 64, a probe); Nsight Compute on the two
# HS 64 backward kernels (s17a) and qr4's dQ kernel, at the 1B shape, T 8192
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
T0=$SECONDS; N=.dev/s17a
timeout 120 $N/test_cuda > $OUT/test_s17a.txt 2>&1
echo "test_cuda s17a rc=$? $((SECONDS-T0)) s: $(tail -1 $OUT/test_s17a.txt)" > $OUT/summary.txt
grep -E "FAIL" $OUT/test_s17a.txt | head -10 >> $OUT/summary.txt
timeout 60 $N/bench_cuda --preset 1b --steps 3 --warmup 2 --profile > $OUT/prof_1b.txt 2>&1
echo "1b profile rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
timeout 120 python3 bench/attn_ab.py --lib $N/libus_attn.so --lib-b .dev/qr4/libus_attn.so --att-heads 32:8:64,32:32:64 --att-seq 4096,8192 --reps 20 --batch 10 > $OUT/ab_qr4.txt 2>&1
echo "attn_ab qr4 rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
SEC="--section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats --section WarpStateStats --section Occupancy"
MET="--metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,regex:sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active,regex:sm__pipe_.*_cycles_active\.avg\.pct_of_peak_sustained_active"
timeout 120 ncu $SEC $MET -k regex:"us__hop_dkdv_kernel|us__hop_dq_kernel" --launch-count 2 $N/bench_cuda --attention --att-heads 32:8:64 --att-seq 8192 > $OUT/ncu_s17a.txt 2>&1
echo "ncu s17a rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
timeout 100 ncu $SEC $MET -k regex:"us__hop_dq_kernel" --launch-count 1 python3 bench/attn_ab.py --lib .dev/qr4/libus_attn.so --att-heads 32:8:64 --att-seq 8192 --reps 1 > $OUT/ncu_qr4.txt 2>&1
echo "ncu qr4 rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
sed -n '/profile of one step/,/total/p' $OUT/prof_1b.txt >> $OUT/summary.txt
grep -E "^ultrascale" $OUT/prof_1b.txt >> $OUT/summary.txt
sed -n '/one process/,$p' $OUT/ab_qr4.txt | cut -c1-130 >> $OUT/summary.txt
for f in ncu_s17a ncu_qr4; do echo "== $f" >> $OUT/summary.txt; grep -E "^  [a-zA-Z_].*\(|Duration|Issue Slots Busy|No Eligible|Eligible Warps|Executed Ipc A|stalled.*ratio +[0-9.]*[1-9]|pct_of_peak_sustained_active +[1-9]" $OUT/$f.txt | awk '{ if ($0 ~ /stalled/ && $NF+0 < 0.05) next; print }' | cut -c1-140 >> $OUT/summary.txt; done
echo "total $((SECONDS-T0)) s" >> $OUT/summary.txt
cat $OUT/summary.txt
