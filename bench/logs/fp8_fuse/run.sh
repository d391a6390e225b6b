#!/bin/bash
# fp8-fuse device run: test_cuda --fp8, then bench pairs (main = dea7488, new = fp8-fuse)
D=.dev/fp8
T0=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - T0) )); }
nvidia-smi -L > $OUT/gpu.txt 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv >> $OUT/gpu.txt 2>&1
echo "== test_cuda --fp8" | tee $OUT/test_cuda_fp8.txt
( time timeout 80 stdbuf -oL $D/test_cuda -v --fp8 ) >> $OUT/test_cuda_fp8.txt 2>&1
echo "test_cuda rc=$? t=$(( $(date +%s) - T0 ))s"; tail -3 $OUT/test_cuda_fp8.txt; grep -c "^  FAIL\|FAIL" $OUT/test_cuda_fp8.txt
run() { # label binary args...
  local lab=$1 b=$2; shift 2
  if [ $(left 215) -le 0 ]; then echo "SKIP $lab (time)"; return; fi
  local t=$(date +%s)
  local line=$(timeout 45 stdbuf -oL $D/$b "$@" 2>&1 | tee -a $OUT/log_$lab.txt | grep "^ultrascale" | tail -1)
  echo "$lab | $b $* | $line | $(( $(date +%s) - t ))s" | tee -a $OUT/summary.txt
}
B1="--preset 1b --steps 6 --warmup 2"
run 1b_a bench_cuda_main $B1 --precision bf16
run 1b_a bench_cuda_main $B1 --precision fp8
run 1b_a bench_cuda $B1 --precision fp8
run 1b_a bench_cuda $B1 --precision bf16
run 1b_a bench_cuda $B1 --precision fp8 --fp8-no-fuse
run prof bench_cuda $B1 --precision fp8 --profile
run 1b_b bench_cuda $B1 --precision fp8
run 1b_b bench_cuda_main $B1 --precision fp8
run 1b_b bench_cuda $B1 --precision bf16
run 1b_b bench_cuda_main $B1 --precision bf16
B8="--preset 8b8 --steps 6 --warmup 2"
run 8b8 bench_cuda_main $B8 --precision fp8
run 8b8 bench_cuda $B8 --precision fp8
run 8b8 bench_cuda $B8 --precision bf16
run 8b8 bench_cuda_main $B8 --precision bf16
run 1b_c bench_cuda_main $B1 --precision fp8
run 1b_c bench_cuda $B1 --precision fp8
grep -A30 "profile of one step" $OUT/log_prof.txt
echo "== summary (total $(( $(date +%s) - T0 ))s)"
cat $OUT/summary.txt
