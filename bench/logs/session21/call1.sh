#!/usr/bin/env bash
# session 21, call 1: s20e = the twentieth session's library (84f6955's kernels); s21fs3 = s20e
# with three forward stages at HS 64 (us__hop_cfg::FS, the causal and the block forward);
# s21zg = s20e whose bench reads ZG_HACK: no us_model_zero_grad memset and every dense Wgrad with
# beta 0 (wrong gradients, a bound on what a first-write-with-beta-0 could save). test_cuda
# s21fs3; --cp-seq at 32:8:64 (s20e, s21fs3, twice); the 1B step bf16 / fp8 with and without
# ZG_HACK (twice); Nsight Compute kernel durations of the causal and the one-block attention at
# T 32k, 16:8:128 (s20e)
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
tar xzf .dev/c1.tgz
T0=$SECONDS
S=$OUT/summary.txt
timeout 150 .dev/s21fs3/test_cuda > $OUT/test_s21fs3.txt 2>&1
echo "test_cuda s21fs3 rc=$? $((SECONDS-T0)) s: $(tail -1 $OUT/test_s21fs3.txt)" > $S
grep -E "FAIL" $OUT/test_s21fs3.txt | head -10 >> $S
for r in 1 2; do for v in s20e s21fs3; do
  timeout 60 .dev/$v/bench_cuda --cp-seq 8192,32768 --cp-heads 32:8:64 > $OUT/cp_${r}_$v.txt 2>&1
  echo "== cp $v rc=$? $((SECONDS-T0)) s: $(grep -E '^\| (causal|one block, positions.*hopper|cp=2 ring, hopper)' $OUT/cp_${r}_$v.txt | awk -F'|' '{print $3 "/" $4}' | tr '\n' ' ')" >> $S
done; done
for r in 1 2; do for p in bf16 fp8; do for z in 0 1; do
  if [ $z = 1 ]; then export ZG_HACK=1; else unset ZG_HACK; fi
  l=$(timeout 100 .dev/s21zg/bench_cuda --preset 1b --steps 6 --warmup 2 --precision $p 2>&1 | grep -E '^ultrascale' | cut -c1-100)
  echo "step zg=$z $p: $l" >> $S
done; done; done
unset ZG_HACK
timeout 150 ncu --metrics gpu__time_duration.sum --csv -k regex:"hop|flash|dot|range" -c 40 \
  .dev/s20e/bench_cuda --cp-seq 32768 --cp-heads 16:8:128 > $OUT/ncu_cp.csv 2> $OUT/ncu_cp.err
echo "ncu rc=$? $((SECONDS-T0)) s" >> $S
python3 - $OUT/ncu_cp.csv >> $S <<'PY'
import csv, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
h = rows[0]; ki = h.index("Kernel Name"); vi = h.index("Metric Value"); ui = h.index("Metric Unit")
for r in rows[1:]:
    n = r[ki].split("(")[0].split("<")[0][-40:]
    print(f"{n:40s} {r[vi]:>12s} {r[ui]}")
PY
echo "total $((SECONDS-T0)) s" >> $S
cat $S
