#!/usr/bin/env bash
# Where FP8 starts to pay: the same 12-layer model (HS 64, T 1024, B 16, on a text file) at
# several widths in bf16 and fp8, interleaved, on one GPU. Prints the median tokens/s of steps
# 11-40 and the ratio; the width where fp8 stops losing sets the FP8 size rule (bench/RESULTS.md).
# Usage: bash bench/fp8_widths.sh TEXT_FILE [TRAIN_CUDA] [extra train flags...]
set -u
data=${1:?usage: fp8_widths.sh TEXT_FILE [TRAIN_CUDA] [flags...]}
bin=${2:-build/train_cuda}
shift 2 2>/dev/null || shift $#
tok() { # median tok/s of steps 11-40 of one run
    "$bin" --layers 12 --dim "$1" --heads $(($1 / 64)) --precision "$2" --seq 1024 --batch 16 --steps 40 \
        --data "$data" --eval-every 1000 "${@:3}" 2>&1 |
        awk '$1 == "step" && $2 > 10 { for (i = 1; i < NF; i++) if ($(i+1) == "tok/s") print $i }' |
        sort -n | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)]; else print 0 }'
}
printf '%-6s | %10s | %10s | %6s\n' width bf16 fp8 ratio
for w in 768 1024 1536 2048 3072; do
    b=$(tok $w bf16 "$@"); f=$(tok $w fp8 "$@")
    printf '%-6s | %10s | %10s | %6s\n' $w "$b" "$f" "$(awk -v b="$b" -v f="$f" 'BEGIN { if (b > 0) printf "%.3f", f / b }')"
done
