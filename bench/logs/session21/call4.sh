#!/usr/bin/env bash
# session 21, call 4: s21c = s20e with three stages for the block forward at HS 64 (the causal
# forward keeps two), the block dQ-from-dS kernel's grid heads fastest and the last query tiles
# first (the block dK/dV kernel's grid as before). test_cuda s21c; --cp-seq 8192,32768 at
# 32:8:64 and 16:8:128 (s20e, s21c, twice); the 1B step bf16 (s20e, s21c, twice)
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
tar xzf .dev/c4.tgz
T0=$SECONDS
S=$OUT/summary.txt
timeout 150 .dev/s21c/test_cuda > $OUT/test_s21c.txt 2>&1
echo "test_cuda s21c rc=$? $((SECONDS-T0)) s: $(tail -1 $OUT/test_s21c.txt)" > $S
grep -E "FAIL" $OUT/test_s21c.txt | head -10 >> $S
for r in 1 2; do for v in s20e s21c; do
  timeout 100 .dev/$v/bench_cuda --cp-seq 8192,32768 --cp-heads 32:8:64,16:8:128 > $OUT/cp_${r}_$v.txt 2>&1
  echo "== cp $v rc=$? $((SECONDS-T0)) s" >> $S
done; done
for r in 1 2; do for v in s20e s21c; do
  l=$(timeout 100 .dev/$v/bench_cuda --preset 1b --steps 6 --warmup 2 --precision bf16 2>&1 | grep -E '^ultrascale' | cut -c1-100)
  echo "step $v bf16: $l" >> $S
done; done
python3 - $OUT >> $S <<'PY'
import re, sys
def rows(f):
    d = {}; T = None
    for l in open(f):
        if l.startswith("| one layer"):
            T = re.search(r"T=(\d+) NH=(\d+) NKV=(\d+) HS=(\d+)", l).group(0); continue
        if l.startswith("| causal") or "hopper" in l:
            p = [x.strip() for x in l.split("|")]
            d[(T, p[1].replace("positions 0..T-1 (= causal), ", ""))] = (float(p[2]), float(p[3]))
    return d
o = sys.argv[1]
A = [rows(f"{o}/cp_{r}_s20e.txt") for r in (1, 2)]; B = [rows(f"{o}/cp_{r}_s21c.txt") for r in (1, 2)]
print("shape | row | fwd s20e | fwd s21c | bwd s20e | bwd s21c | fwd ratio | bwd ratio")
for k in A[0]:
    fa = [x[k][0] for x in A]; fb = [x[k][0] for x in B]; ba = [x[k][1] for x in A]; bb = [x[k][1] for x in B]
    print(f"{k[0]} | {k[1][:34]} | {fa} | {fb} | {ba} | {bb} | {sum(fb)/sum(fa):.3f} | {sum(bb)/sum(ba):.3f}")
PY
echo "total $((SECONDS-T0)) s" >> $S
cat $S
