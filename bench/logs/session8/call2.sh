#!/usr/bin/env bash
# session 8, call 2: is the step's GEMM deficit (5-18 % below the same GEMM alone) the clock?
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
B=.dev/c1; T0=$SECONDS
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv,noheader -lms 20 > $OUT/smi.txt 2>&1 &
P=$!
sleep 1; echo "mark step $(date +%H:%M:%S.%N)" >> $OUT/marks.txt
timeout 60 stdbuf -oL $B/bench_cuda --preset 1b --steps 12 --warmup 2 > $OUT/step.txt 2>&1
echo "mark idle $(date +%H:%M:%S.%N)" >> $OUT/marks.txt
sleep 1
echo "mark sustain $(date +%H:%M:%S.%N)" >> $OUT/marks.txt
timeout 60 python3 .dev/gemm_sustain.py > $OUT/sustain.txt 2>&1
echo "mark end $(date +%H:%M:%S.%N)" >> $OUT/marks.txt
kill $P
python3 - $OUT <<'PY'
import sys, statistics
d = sys.argv[1]
marks = [l.split() for l in open(d + "/marks.txt")]
def sec(s):
    h, m, x = s.split(":"); return int(h) * 3600 + int(m) * 60 + float(x)
mk = [(n, sec(t)) for _, n, t in marks]
rows = []
for l in open(d + "/smi.txt"):
    p = [x.strip() for x in l.split(",")]
    try:
        rows.append((sec(p[0].split()[1]), float(p[1].split()[0]), float(p[2].split()[0]), p[3], p[4]))
    except Exception:
        pass
for (n, a), (_, b) in zip(mk, mk[1:]):
    w = [r for r in rows if a <= r[0] < b]
    if not w: print(n, "no samples"); continue
    cl = [r[1] for r in w]; pw = [r[2] for r in w]
    busy = [r for r in w if r[2] > 300]
    print(f"{n:8s} {len(w):4d} samples: clock median {statistics.median(cl):.0f} MHz (min {min(cl):.0f}), power median {statistics.median(pw):.0f} W; "
          f"while > 300 W: {len(busy)} samples, clock median {statistics.median([r[1] for r in busy]) if busy else 0:.0f} MHz; reasons {sorted(set(r[4] for r in busy))[:4]}")
PY
grep -E "^ultrascale" $OUT/step.txt | cut -c1-110
cat $OUT/sustain.txt
echo "total $((SECONDS-T0)) s"
