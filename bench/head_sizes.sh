#!/usr/bin/env bash
# Training speed across head sizes on one GPU: a 4-layer model (width 768, or 640 for HS 80) on
# a text file, bf16 (and HS 64 in fp16), T 1024, B 16 — the shapes issue 23 found falling off the
# flash path. Prints which attention kernels each got and the median tokens/s of steps 11-30.
# Usage: bash bench/head_sizes.sh TEXT_FILE [TRAIN_CUDA]   (default build/train_cuda)
set -u
data=${1:?usage: head_sizes.sh TEXT_FILE [TRAIN_CUDA]}
bin=${2:-build/train_cuda}
printf '%-5s %-6s %-5s %-6s | %-40s | %10s\n' HS prec dim heads "attention" "tok/s"
for cfg in "64 bf16 768 12" "80 bf16 640 8" "96 bf16 768 8" "128 bf16 768 6" "192 bf16 768 4" "256 bf16 768 3" "64 fp16 768 12"; do
    set -- $cfg
    log=$("$bin" --layers 4 --dim "$3" --heads "$4" --precision "$2" --seq 1024 --batch 16 --steps 30 \
          --data "$data" --eval-every 1000 2>&1)
    att=$(printf '%s\n' "$log" | grep -E '^(attention|warning: attention)' | head -n 1 | cut -c1-40)
    tok=$(printf '%s\n' "$log" | grep -E '^step +([0-9]+)' | awk '$2 > 10 { for (i = 1; i <= NF; i++) if ($(i+1) == "tok/s") print $i }' |
          sort -n | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)]; else print "-" }')
    printf '%-5s %-6s %-5s %-6s | %-40s | %10s\n' "$1" "$2" "$3" "$4" "${att:--}" "$tok"
done
