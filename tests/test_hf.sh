#!/usr/bin/env bash
# Hugging Face Llama models against transformers' own numbers (tests/hf_fixture.py): for each
# fixture in tests/hf/, its weights are made again from their seed (numpy + safetensors), then
# test_ckpt --hf loads it and compares RoPE's frequencies, every position's logits, the loss and
# every gradient with the fp32 values transformers computed. Where transformers is installed, it
# also reloads what we saved (our config.json and weights) and must get the same logits. Without
# python3 + safetensors + numpy it prints SKIP. US_PYTHON picks another interpreter.
set -u
BIN=${1:-build/test_ckpt}
PY=${US_PYTHON:-python3}
if ! "$PY" -c "import safetensors, numpy" 2>/dev/null; then
    echo "SKIP python3 with safetensors and numpy not found (pip install safetensors numpy, or set US_PYTHON)"
    exit 0
fi
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0 fail=0
tf=0
"$PY" -c "import torch, transformers" 2>/dev/null && tf=1
for fx in tests/hf/*/; do
    name=$(basename "$fx")
    "$PY" tests/hf_fixture.py weights "$fx" "$T/$name" > /dev/null || { fail=$((fail + 1)); continue; }
    out=$("$BIN" --hf "$fx" "$T/$name" "$T/$name.ours")
    printf '%s\n' "$out" | grep -v -E '^[^ ].* [0-9]+ passed, [0-9]+ failed' | sed "s/^/  [$name] /"
    line=$(printf '%s\n' "$out" | grep -E '[0-9]+ passed, [0-9]+ failed' | tail -n 1)
    pass=$((pass + $(sed -E 's/.* ([0-9]+) passed.*/\1/' <<<"${line:- 0 passed, 1 failed}")))
    fail=$((fail + $(sed -E 's/.* ([0-9]+) failed.*/\1/' <<<"${line:- 0 passed, 1 failed}")))
    if [ "$tf" = 1 ]; then   # transformers reads what we saved
        out=$("$PY" tests/hf_fixture.py ours "$fx" "$T/$name.ours" 2>/dev/null)
        printf '%s\n' "$out" | grep -v '^test_hf_ours' | sed "s/^/  [$name] /"
        line=$(printf '%s\n' "$out" | grep '^test_hf_ours' | tail -n 1)
        pass=$((pass + $(sed -E 's/.* ([0-9]+) passed.*/\1/' <<<"${line:- 0 passed, 1 failed}")))
        fail=$((fail + $(sed -E 's/.* ([0-9]+) failed.*/\1/' <<<"${line:- 0 passed, 1 failed}")))
    fi
done
[ "$tf" = 1 ] || echo "  (transformers not installed: its reading of our saved checkpoints skipped)"
echo "test_hf: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
