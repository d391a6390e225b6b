#!/usr/bin/env bash
# session 21, call 5: s21d = s21c with the block dK/dV tile's mask in a pass of its own (the
# causal kernel's: hidden scores set to -inf, one copy of the tile math) and L2 = +inf for a
# query that saw no key. test_cuda --attn-blocks s21d; --cp-seq 8192,32768 at 32:8:64 and
# 16:8:128 (s21c, s21d, twice)
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
tar xzf .dev/c5.tgz
T0=$SECONDS
S=$OUT/summary.txt
timeout 60 .dev/s21d/test_cuda --attn-blocks > $OUT/test_s21d.txt 2>&1
echo "test_cuda --attn-blocks s21d rc=$? $((SECONDS-T0)) s: $(tail -1 $OUT/test_s21d.txt)" > $S
grep -E "FAIL" $OUT/test_s21d.txt | head -10 >> $S
for r in 1 2; do for v in s21c2 s21d; do
  timeout 60 .dev/$v/bench_cuda --cp-seq 8192,32768 --cp-heads 32:8:64,16:8:128 > $OUT/cp_${r}_$v.txt 2>&1
  echo "== cp $v rc=$? $((SECONDS-T0)) s" >> $S
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
A = [rows(f"{o}/cp_{r}_s21c2.txt") for r in (1, 2)]; B = [rows(f"{o}/cp_{r}_s21d.txt") for r in (1, 2)]
print("shape | row | bwd s21c | bwd s21d | bwd ratio")
for k in A[0]:
    ba = [x[k][1] for x in A]; bb = [x[k][1] for x in B if k in x]
    print(f"{k[0]} | {k[1][:34]} | {ba} | {bb} | {sum(bb)/max(1e-9, sum(ba[:len(bb)])):.3f}")
PY
echo "total $((SECONDS-T0)) s" >> $S
cat $S
