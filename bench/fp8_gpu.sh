#!/usr/bin/env bash
# FP8 training on one H200 (issue 10), about 8 minutes:
#   (a) GEMM-only rates: FP8 block-scaled (1x128 x 128x128, 1x128 x 1x128) and per-tensor vs bf16
#       at the 1B shape's linear layers, and the fused quantiser's bandwidth   (bench_cuda --fp8-gemm)
#   (b) tokens/s of the Llama-3.2-1B training step, bf16 vs fp8 vs fp8-tensor, in this one run, and
#       the recipe's ceiling (--fp8-free-quant: every quantisation skipped); then 4 micro-batches per
#       step (the weight cache on and off), and Llama-3-8B's width with 8 layers (--preset 8b8)
#   (c) convergence: a ~85M model (12 x 768) on tinyshakespeare (its last 10% held out and evaluated
#       every 100 steps), bf16 vs fp8, ~1.5 minutes each,
#       JSONL logs, an SVG of both curves and the relative gap of the final losses
# Build first: make build/bench_cuda build/train_cuda
# Usage: bash bench/fp8_gpu.sh      logs go to $OUT (the device tool's folder) or bench_out/
#   STEPS (default 3000) caps each convergence run; each run is also cut at CONV_S seconds (180)
set -u
out=${OUT:-bench_out}; mkdir -p "$out"
B=build
DATA=${DATA:-build/tinyshakespeare.txt}
STEPS=${STEPS:-3000}
CONV_S=${CONV_S:-180}
for b in bench_cuda train_cuda; do [ -x $B/$b ] || { echo "fp8_gpu.sh: $B/$b is missing: make $B/$b"; exit 1; }; done
[ -f "$DATA" ] || { echo "fp8_gpu.sh: no data file $DATA (set DATA=...)"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"

echo "=== (a) GEMM-only"
timeout 150 $B/bench_cuda --fp8-gemm 2>&1 | tee "$out/fp8_gemm.txt"

echo "=== (b) Llama-3.2-1B step (T=4096, B=4)"
tok() { n=$1; shift; timeout 200 $B/bench_cuda "$@" --steps 6 --warmup 2 --json "$out/tok_$n.json" 2>&1 | tee "$out/tok_$n.txt" | grep -E "^ultrascale|failed"; }
for p in bf16 fp8 fp8-tensor; do tok 1b_$p --preset 1b --precision $p; done
tok 1b_free --preset 1b --precision fp8 --fp8-free-quant
tok 1b4_bf16 --preset 1b --precision bf16 --accum 4
tok 1b4_fp8 --preset 1b --precision fp8 --accum 4
tok 1b4_fp8nowc --preset 1b --precision fp8 --accum 4 --fp8-no-weight-cache
tok 8b8_bf16 --preset 8b8 --precision bf16
tok 8b8_fp8 --preset 8b8 --precision fp8
tok 8b8_free --preset 8b8 --precision fp8 --fp8-free-quant

echo "=== (c) convergence on $DATA: 12 layers x 768, T=1024, B=16 (fp8 at every size: --fp8-min-dim 16)"
for p in bf16 fp8; do
    timeout --signal=INT $CONV_S $B/train_cuda --data "$DATA" --layers 12 --dim 768 --heads 12 --seq 1024 --batch 16 \
        --steps $STEPS --lr 1e-3 --warmup 100 --precision $p $([ $p = fp8 ] && echo --fp8-min-dim 16) --eval-every 100 --sample 0 --log "$out/shakespeare_$p.jsonl" \
        > "$out/shakespeare_$p.txt" 2>&1
    grep -E "^(model|fp8):" "$out/shakespeare_$p.txt"; tail -n 2 "$out/shakespeare_$p.txt"
done
python3 bench/fp8_curves.py "$out/shakespeare_bf16.jsonl" "$out/shakespeare_fp8.jsonl" "$out/fp8_curves.svg" | tee "$out/curves.txt"

echo; echo "=== summary"
python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
def load(n):
    try: return json.load(open(os.path.join(out, "tok_%s.json" % n)))
    except Exception: return None
print("| step | tok/s | MFU | step ms | peak GiB | vs bf16 of its row group |\n|---|---|---|---|---|---|")
for group, names in (("1b", ("1b_bf16", "1b_fp8", "1b_fp8-tensor", "1b_free")), ("1b accum 4", ("1b4_bf16", "1b4_fp8", "1b4_fp8nowc")),
                     ("8b8", ("8b8_bf16", "8b8_fp8", "8b8_free"))):
    ref = load(names[0])
    for n in names:
        j = load(n)
        if not j: print("| %s | failed (see tok_%s.txt) | | | | |" % (n, n)); continue
        rel = j["tok_s"] / ref["tok_s"] if ref else float("nan")
        print("| %s (%s) | %.0f | %.1f%% | %.1f | %.1f | %.3fx%s |" % (n, j["precision"], j["tok_s"], 100 * j["mfu"], j["step_ms"], j["peak_gib"], rel,
              " (goal 1.4x: %s)" % ("met" if rel >= 1.4 else "not met") if n == "1b_fp8" else ""))
PY
grep -E "^\| [0-9]" "$out/fp8_gemm.txt"
cat "$out/curves.txt"
