#!/usr/bin/env bash
# session 24, call 2: s24b (e77e1c4, the library as at the session's start plus bench_cuda
# --att-mode). (1) the GPU's power and SM clock sampled every 10 ms by nvidia-smi while the 1B
# bf16 and fp8 steps run (20 steps each): is the step at the power cap? (2) the 1B bf16 step
# with the attention backward's dS through memory at HS 64 (--att-mode 7, five GEMMs a tile
# instead of seven) against the default, interleaved three times; fp8 once each.
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
tar xzf .dev/c2.tgz -C .dev
T0=$SECONDS; S=$OUT/summary.txt; B=.dev/s24b/bench_cuda
nvidia-smi -q -d POWER,CLOCK,PERFORMANCE > $OUT/power_info.txt 2>&1
F="timestamp,power.draw.instant,power.draw.average,clocks.sm,clocks.mem,temperature.gpu,clocks_event_reasons.active"
nvidia-smi --query-gpu=$F --format=csv,noheader > /dev/null 2>&1 || F="timestamp,power.draw,clocks.sm,clocks.mem,temperature.gpu,clocks_throttle_reasons.active"
echo "fields: $F" > $S
grep -E "Power Limit|Max Clocks|SM  |Graphics" $OUT/power_info.txt | head -12 >> $S
trace() { # name, args...
  local n=$1; shift
  nvidia-smi --query-gpu=$F --format=csv,noheader,nounits -lms 10 > $OUT/trace_$n.csv 2>&1 &
  local p=$!
  sleep 1
  timeout 100 $B "$@" 2>&1 | grep -E '^ultrascale' | cut -c1-100 > $OUT/trace_$n.txt
  sleep 1
  kill $p; wait $p 2>/dev/null
  echo "$n: $(cat $OUT/trace_$n.txt)" >> $S
}
trace bf16 --preset 1b --steps 20 --warmup 2 --precision bf16
trace fp8 --preset 1b --steps 20 --warmup 2 --precision fp8
st() { timeout 100 $B --preset 1b --steps 6 --warmup 2 "$@" 2>&1 | grep -E '^ultrascale' | cut -c1-100; }
for r in 1 2 3; do
  echo "1b bf16 default: $(st --precision bf16)" >> $S
  echo "1b bf16 att-mode 7: $(st --precision bf16 --att-mode 7)" >> $S
done
echo "1b fp8 default: $(st --precision fp8)" >> $S
echo "1b fp8 att-mode 7: $(st --precision fp8 --att-mode 7)" >> $S
echo "elapsed $((SECONDS-T0)) s" >> $S
python3 - $OUT >> $S <<'PY'
import sys, csv, statistics as stt
out = sys.argv[1]
for n in ("bf16", "fp8"):
    rows = []
    for r in csv.reader(open(f"{out}/trace_{n}.csv")):
        try: rows.append([x.strip() for x in r])
        except Exception: pass
    def num(x):
        try: return float(x.split()[0])
        except Exception: return None
    p = [num(r[1]) for r in rows if len(r) > 3]
    p = [x for x in p if x is not None]
    busy = [x for x in p if x > 300]
    clk_i = 3 if len(rows[0]) > 6 else 2
    c = [num(r[clk_i]) for r in rows if len(r) > clk_i and num(r[1]) and num(r[1]) > 300]
    c = [x for x in c if x]
    if busy:
        q = sorted(busy)
        print(f"{n}: {len(p)} samples, {len(busy)} above 300 W: power median {stt.median(busy):.0f} W, "
              f"p10 {q[len(q)//10]:.0f}, p90 {q[9*len(q)//10]:.0f}, max {max(busy):.0f}; "
              f"SM clock median {stt.median(c):.0f} MHz, min {min(c):.0f}, max {max(c):.0f}")
PY
cat $S
