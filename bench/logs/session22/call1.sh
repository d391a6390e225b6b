#!/usr/bin/env bash
# session 22, call 1: s22a = 46d35eb (the twenty-first session's end, with the review's
# us__hop_kcursor, not yet run on a GPU); s22b = s22a + SwiGLU's forward making hᵀ's 128×1 FP8
# operand (us__k_swiglu_fwd_fp8t), kept in h's bytes for the down linear's Wgrad.
# test_cuda s22b; --cp-seq s21c against s22b (the kcursor refactor: same kernels expected);
# the 1B step fp8 s22a / s22b and bf16 s22b interleaved three times, 8b8 once; --profile fp8 both
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
tar xzf .dev/c1.tgz
T0=$SECONDS
S=$OUT/summary.txt
timeout 150 .dev/s22b/test_cuda > $OUT/test_s22b.txt 2>&1
echo "test_cuda s22b rc=$? $((SECONDS-T0)) s: $(tail -1 $OUT/test_s22b.txt)" > $S
grep -E "FAIL" $OUT/test_s22b.txt | head -10 >> $S
for v in s21c s22b; do
  timeout 100 .dev/$v/bench_cuda --cp-seq 8192,32768 --cp-heads 32:8:64,16:8:128 > $OUT/cp_$v.txt 2>&1
  echo "== cp $v rc=$? $((SECONDS-T0)) s" >> $S
done
st() { timeout 100 .dev/$1/bench_cuda --preset $2 --steps 6 --warmup 2 --precision $3 2>&1 | grep -E '^ultrascale' | cut -c1-100; }
for r in 1 2 3; do
  echo "1b fp8 s22a: $(st s22a 1b fp8)" >> $S
  echo "1b fp8 s22b: $(st s22b 1b fp8)" >> $S
  echo "1b bf16 s22b: $(st s22b 1b bf16)" >> $S
done
echo "8b8 fp8 s22a: $(st s22a 8b8 fp8)" >> $S
echo "8b8 fp8 s22b: $(st s22b 8b8 fp8)" >> $S
echo "8b8 bf16 s22b: $(st s22b 8b8 bf16)" >> $S
for v in s22a s22b; do
  timeout 100 .dev/$v/bench_cuda --preset 1b --steps 3 --warmup 2 --precision fp8 --profile > $OUT/prof_$v.txt 2>&1
  echo "== profile $v rc=$? $((SECONDS-T0)) s" >> $S
done
python3 - $OUT >> $S <<'PY'
import re, sys
o = sys.argv[1]
def rows(f):
    d = {}; T = None
    for l in open(f):
        if l.startswith("| one layer"):
            T = re.search(r"T=(\d+) NH=(\d+) NKV=(\d+) HS=(\d+)", l).group(0); continue
        if l.startswith("| causal") or "hopper" in l:
            p = [x.strip() for x in l.split("|")]
            d[(T, p[1].replace("positions 0..T-1 (= causal), ", "")[:30])] = (float(p[2]), float(p[3]))
    return d
try:
    A = rows(f"{o}/cp_s21c.txt"); B = rows(f"{o}/cp_s22b.txt")
    print("shape | row | fwd s21c s22b | bwd s21c s22b")
    for k in A:
        print(f"{k[0]} | {k[1]} | {A[k][0]} {B[k][0]} | {A[k][1]} {B[k][1]}")
except Exception as e:
    print("cp parse:", e)
PY
for v in s22a s22b; do echo "-- profile $v"; grep -iE 'quant|swiglu|fp8|step|gemm' $OUT/prof_$v.txt | head -30; done >> $S
echo "total $((SECONDS-T0)) s" >> $S
cat $S
