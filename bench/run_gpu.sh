#!/usr/bin/env bash
# Every GPU benchmark, side by side in one run on the GPU machine:
#   ultrascale (default, and with --gemm-tune: cuBLASLt's algorithms timed in the warm-up steps)
#   vs PyTorch (eager, torch.compile) training steps on the 1B and 200M shapes,
#   attention vs SDPA (cuDNN and flash backends), in-library GEMM vs standalone cuBLASLt, the
#   gemm_steps lesson, ring attention's block kernels (context parallelism) against causal
#   flash attention. Ends with one side-by-side table (bench/gpu_table.py). Each training run
#   goes through bench/power.py: the board's power and SM clock while it ran, in the table too.
#   and, where build/libus_attn.so is built, attention against SDPA's cuDNN backend in one process,
#   rep by rep (bench/attn_ab.py: the fairer of the two attention comparisons), once with one
#   call a sample and once with ten (the host's set-up hidden, as in a training step)
# Build the binaries first (here or there): make build/bench_cuda build/gemm_steps build/libus_attn.so
# Usage: bash bench/run_gpu.sh [quick]     logs go to $OUT (the device tool's folder) or bench_out/
set -u
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
out=${OUT:-bench_out}; mkdir -p "$out"
B=${B:-build}  # the binaries' folder (B=.dev/x bash bench/run_gpu.sh)
steps=10; [ "${1:-}" = quick ] && steps=4
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' | tee -a "$out/gpu.txt"
W="python3 bench/power.py --"  # each training run's power and SM clock (its last log line)
for p in 1b 200m; do
    $W $B/bench_cuda --preset $p --steps $steps --warmup 3 --profile --json "$out/us_$p.json" 2>&1 | tee "$out/us_$p.txt"
    $W $B/bench_cuda --preset $p --steps $steps --warmup 4 --gemm-tune --json "$out/us_tuned_$p.json" 2>&1 | tee "$out/us_tuned_$p.txt"
    $W python3 bench/torch_llama.py --preset $p --steps $steps --warmup-steps 3 --json "$out/torch_eager_$p.json" 2>&1 | tee "$out/torch_eager_$p.txt"
    $W python3 bench/torch_llama.py --preset $p --steps $steps --warmup-steps 3 --compile --json "$out/torch_compile_$p.json" 2>&1 | tee "$out/torch_compile_$p.txt"
done
$B/bench_cuda --gemm --attention 2>&1 | tee "$out/us_kernels.txt"
$B/bench_cuda --cp 2>&1 | tee "$out/us_cp.txt"
python3 bench/sdpa_bench.py 2>&1 | tee "$out/sdpa.txt"
if [ -f $B/libus_attn.so ]; then
    python3 bench/attn_ab.py --lib $B/libus_attn.so 2>&1 | tee "$out/attn_ab.txt"
    python3 bench/attn_ab.py --lib $B/libus_attn.so --batch 10 2>&1 | tee "$out/attn_ab10.txt"
fi
[ -x $B/gemm_steps ] && $B/gemm_steps 2>&1 | tail -n 12 | tee "$out/gemm_steps.txt"
echo; echo "=== summary"
grep -h -E '^(ultrascale|torch|power)' "$out"/us_1b.txt "$out"/us_tuned_1b.txt "$out"/torch_*_1b.txt \
    "$out"/us_200m.txt "$out"/us_tuned_200m.txt "$out"/torch_*_200m.txt
echo
python3 bench/gpu_table.py "$out" | tee "$out/table.txt"
for f in "$out/attn_ab.txt" "$out/attn_ab10.txt"; do
    [ -f "$f" ] && sed -n '/one process/,$p' "$f" | tee -a "$out/table.txt"
done
