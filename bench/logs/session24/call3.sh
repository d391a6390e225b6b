#!/usr/bin/env bash
# session 24, call 3: the training steps of bench/run_gpu.sh (ours, ours --gemm-tune, PyTorch
# eager and torch.compile at 1B and 200M, 10 steps) each through bench/power.py (board power,
# the share at the software power cap, SM clock), then bench/gpu_table.py; and ours at 1B in fp8.
# Binary s24b (e77e1c4: the library as at the session's start, bench_cuda with --att-mode).
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
tar xzf .dev/c2.tgz -C .dev
T0=$SECONDS; out=$OUT; B=.dev/s24b; steps=10
W="python3 bench/power.py --"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv,noheader > "$out/gpu.txt"
for p in 1b 200m; do
    $W $B/bench_cuda --preset $p --steps $steps --warmup 3 > "$out/us_$p.txt" 2>&1
    $W $B/bench_cuda --preset $p --steps $steps --warmup 4 --gemm-tune > "$out/us_tuned_$p.txt" 2>&1
    $W python3 bench/torch_llama.py --preset $p --steps $steps --warmup-steps 3 > "$out/torch_eager_$p.txt" 2>&1
    $W python3 bench/torch_llama.py --preset $p --steps $steps --warmup-steps 3 --compile > "$out/torch_compile_$p.txt" 2>&1
    echo "$p done $((SECONDS-T0)) s" >> "$out/progress.txt"
done
$W $B/bench_cuda --preset 1b --steps $steps --warmup 3 --precision fp8 > "$out/us_fp8_1b.txt" 2>&1
{ cat "$out/gpu.txt"
  grep -h -E '^(ultrascale|torch|power)' "$out"/us_1b.txt "$out"/us_tuned_1b.txt "$out"/torch_*_1b.txt \
      "$out"/us_200m.txt "$out"/us_tuned_200m.txt "$out"/torch_*_200m.txt "$out"/us_fp8_1b.txt | cut -c1-230
  echo
  python3 bench/gpu_table.py "$out"
  echo "total $((SECONDS-T0)) s"; } > "$out/table.txt"
mkdir -p "$out/logs" && mv "$out"/us_*.txt "$out"/torch_*.txt "$out/logs/" && tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
cat "$out/table.txt"
