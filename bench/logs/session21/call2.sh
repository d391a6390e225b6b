#!/usr/bin/env bash
# session 21, call 2: Nsight Compute kernel durations (one metric pass) of the causal and the
# one-block backward, 32:8:64 and 16:8:128 at T 8192, and the block kernels at T 32k 16:8:128
# (s20e); the 1B step bf16 at s20e and s21fs3 (three forward stages at HS 64), interleaved twice
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
tar xzf .dev/c1.tgz
T0=$SECONDS
S=$OUT/summary.txt
: > $S
summ() {
python3 - $1 <<'PY'
import csv, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
h = rows[0]; ki = h.index("Kernel Name"); mi = h.index("Metric Name"); vi = h.index("Metric Value"); ii = h.index("ID")
k = {}
for r in rows[1:]:
    k.setdefault(r[ii], [r[ki].split("(")[0].replace("void ", "")[:60], {}])[1][r[mi]] = r[vi]
for i, (n, m) in k.items():
    print(f"{n:60s} {m.get('gpu__time_duration.sum',''):>12s} grid {m.get('launch__grid_size',''):>7s} regs {m.get('launch__registers_per_thread','')}")
PY
}
M=gpu__time_duration.sum,launch__grid_size,launch__registers_per_thread
for sh in 32:8:64 16:8:128; do
  timeout 120 ncu --metrics $M --csv -k regex:hop -c 70 .dev/s20e/bench_cuda --cp-seq 8192 --cp-heads $sh > $OUT/ncu_$sh.csv 2>/dev/null
  echo "== ncu T 8192 $sh rc=$? $((SECONDS-T0)) s" >> $S
  summ $OUT/ncu_$sh.csv >> $S
done
timeout 120 ncu --metrics $M --csv -k regex:hop_block -c 24 .dev/s20e/bench_cuda --cp-seq 32768 --cp-heads 16:8:128 > $OUT/ncu_32k.csv 2>/dev/null
echo "== ncu T 32768 16:8:128 block rc=$? $((SECONDS-T0)) s" >> $S
summ $OUT/ncu_32k.csv >> $S
for r in 1 2; do for v in s20e s21fs3; do
  l=$(timeout 100 .dev/$v/bench_cuda --preset 1b --steps 6 --warmup 2 --precision bf16 2>&1 | grep -E '^ultrascale' | cut -c1-100)
  echo "step $v bf16: $l" >> $S
done; done
echo "total $((SECONDS-T0)) s" >> $S
tail -8 $S
