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
"$BIN" --py "$T"
