#!/usr/bin/env bash
# session 12, call 7: is train_cuda bit-reproducible at all? Call 6's two runs that read one tune
# file saved different weights. Two runs by default (no tuning, no file) and two more that read
# call 6's file, each pair's safetensors compared
export NCCL_NVLS_ENABLE=0
N=.dev/s12e; cp bench/logs/session12/call6/tune.txt /tmp/tune.txt
for r in D E; do timeout 30 $N/train_cuda --steps 6 --save /tmp/r$r > /tmp/t$r.txt 2>&1; echo "$r rc=$?"; done
for r in F G; do timeout 30 $N/train_cuda --gemm-tune-file /tmp/tune.txt --steps 6 --save /tmp/r$r > /tmp/t$r.txt 2>&1; echo "$r rc=$? $(grep -h gemm-tune /tmp/t$r.txt)"; done
for p in "D E" "F G"; do set -- $p; s=0; d=0
  for f in $(cd /tmp/r$1 && find . -name '*.safetensors'); do if cmp -s /tmp/r$1/$f /tmp/r$2/$f; then s=$((s+1)); else d=$((d+1)); echo "  $f: $(cmp /tmp/r$1/$f /tmp/r$2/$f | head -1)"; fi; done
  echo "$1 vs $2: $s the same, $d differ"; done
grep -h "^step     6" /tmp/t[DEFG].txt | cut -c1-70
