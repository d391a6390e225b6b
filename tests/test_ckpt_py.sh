#!/usr/bin/env bash
# Files written by Python's `safetensors` package load here (tests/ckpt_fixture.py, then
# test_ckpt --py). Without python3 + safetensors + numpy it prints SKIP (CI installs them:
# .ci/run). US_PYTHON picks another interpreter (e.g. a virtual environment's).
set -u
BIN=${1:-build/test_ckpt}
PY=${US_PYTHON:-python3}
if ! "$PY" -c "import safetensors, numpy" 2>/dev/null; then
    echo "SKIP python3 with safetensors and numpy not found (pip install safetensors numpy, or set US_PYTHON)"
    exit 0
fi
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
"$PY" "$(dirname "$0")/ckpt_fixture.py" "$T" || { echo "test_ckpt_py: 0 passed, 1 failed"; exit 1; }
out=$("$BIN" --py "$T"); rc=$?
printf '%s\n' "$out" | sed 's/ passed, / passed; /'   # run_all.sh reads only the total below
line=$(printf '%s\n' "$out" | grep -E '[0-9]+ passed, [0-9]+ failed' | tail -n 1)
pass=$(sed -E 's/.* ([0-9]+) passed.*/\1/' <<<"${line:- 0 passed, 1 failed}"); fail=$(sed -E 's/.* ([0-9]+) failed.*/\1/' <<<"${line:- 0 passed, 1 failed}")
# the other direction: Python's safetensors opens what we write (its Rust header validation), every
# F32 tensor reads, and the names and shapes are Hugging Face Llama's for the run's config
TRAIN=${2:-$(dirname "$BIN")/train}
if [ -x "$TRAIN" ]; then
    "$TRAIN" --layers 2 --dim 32 --heads 4 --kv-heads 2 --steps 2 --threads 1 --eval-every 0 --exact-match 16 --quiet --save "$T/ours" > /dev/null 2>&1 &&
    "$TRAIN" --layers 2 --dim 32 --heads 4 --kv-heads 2 --steps 2 --threads 1 --eval-every 0 --exact-match 16 --quiet --precision bf16 --save "$T/ours16" > /dev/null 2>&1 &&
    pyout=$("$PY" - "$T/ours/step_00000002" "$T/ours16/step_00000002" <<'PY'
import json, sys
from safetensors import safe_open
d, d16 = sys.argv[1], sys.argv[2]
cfg = json.load(open(d + "/config.json"))
C, L, NH, NKV, F, V = (cfg[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size"))
HS = C // NH
want = {"model.embed_tokens.weight": [V, C], "model.norm.weight": [C], "lm_head.weight": [V, C]}
for l in range(L):
    p = "model.layers.%d." % l
    want.update({p + "input_layernorm.weight": [C], p + "post_attention_layernorm.weight": [C],
                 p + "self_attn.q_proj.weight": [NH * HS, C], p + "self_attn.k_proj.weight": [NKV * HS, C],
                 p + "self_attn.v_proj.weight": [NKV * HS, C], p + "self_attn.o_proj.weight": [C, NH * HS],
                 p + "mlp.gate_proj.weight": [F, C], p + "mlp.up_proj.weight": [F, C], p + "mlp.down_proj.weight": [C, F]})
fails = 0
with safe_open(d + "/model.safetensors", framework="numpy") as g:
    got = {k: list(g.get_tensor(k).shape) for k in g.keys()}
ok = got == want
print("  %s  Python reads our fp32 model.safetensors: %d tensors, HF names and shapes" % ("ok  " if ok else "FAIL", len(got))); fails += not ok
with safe_open(d + "/optimizer.safetensors", framework="numpy") as g:
    keys = set(g.keys()); n = sum(1 for k in keys if g.get_tensor(k) is not None)
ok = keys == {"optimizer.exp_avg." + k for k in want} | {"optimizer.exp_avg_sq." + k for k in want}
print("  %s  Python reads our optimizer.safetensors (%d fp32 moments)" % ("ok  " if ok else "FAIL", n)); fails += not ok
with safe_open(d16 + "/model.safetensors", framework="numpy") as g:   # numpy has no bf16: the header only
    ok = set(g.keys()) == set(want)
with safe_open(d16 + "/optimizer.safetensors", framework="numpy") as g:
    ok = ok and {k for k in g.keys() if k.startswith("master.")} == {"master." + k for k in want}
print("  %s  Python opens our bf16 checkpoint (BF16 weights, fp32 master.<name>)" % ("ok  " if ok else "FAIL")); fails += not ok
print("PYREADS %d %d" % (3 - fails, fails))
sys.exit(1 if fails else 0)
PY
); [ $? -eq 0 ] || rc=1
    printf '%s\n' "$pyout" | grep -v '^PYREADS'
    p2=$(grep '^PYREADS' <<<"$pyout" | cut -d' ' -f2); f2=$(grep '^PYREADS' <<<"$pyout" | cut -d' ' -f3)
    pass=$((pass + ${p2:-0})); fail=$((fail + ${f2:-1}))
else
    echo "  (no $TRAIN: the Python-reads-ours half skipped)"
fi
echo "test_ckpt_py: $pass passed, $fail failed"
[ "$rc" -eq 0 ] && [ "$fail" -eq 0 ]
