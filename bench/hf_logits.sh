#!/usr/bin/env bash
# Our logits against Hugging Face Llama's on one checkpoint (issue 11). Trains a tiny Llama with
# our trainer (GQA, untied, a few steps so the weights are not the init), saves it as safetensors
# with HF names, and compares the last-position logits of 4 sequences of 32 tokens, fp32:
#   bash bench/hf_logits.sh            (from the repository root; ~10-20 s)
# The reference is transformers' LlamaForCausalLM when `import transformers` works, else a
# self-contained torch (or numpy) re-implementation of HF's forward reading the safetensors files.
# Prints the max |ours − reference| and PASS/FAIL (tolerance 1e-4 · max(1, max |logit|)); where a GPU
# and nvcc exist, it does it twice: our CPU logits, then the CUDA backend's (build/hf_logits_cuda).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${US_PYTHON:-python3}
make -s build/train build/hf_logits
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
./build/train --layers 2 --dim 64 --heads 4 --kv-heads 2 --steps 20 --eval-every 0 --threads 4 --quiet --save "$T/ck" > /dev/null
"$PY" -c "import random, struct, sys; random.seed(1); sys.stdout.buffer.write(struct.pack('<128i', *[random.randrange(256) for _ in range(128)]))" > "$T/tok.i32"
./build/hf_logits "$T/ck/step_00000020" "$T/tok.i32" 4 32 "$T/ours.f32"
"$PY" bench/hf_logits.py "$T/ck/step_00000020" "$T/tok.i32" 4 32 "$T/ours.f32"
# on a machine with nvcc and a GPU: the same checkpoint loaded into device memory, logits on the GPU
if command -v nvidia-smi > /dev/null 2>&1 && nvidia-smi -L > /dev/null 2>&1 && { command -v nvcc > /dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; }; then
    make -s build/hf_logits_cuda
    ./build/hf_logits_cuda "$T/ck/step_00000020" "$T/tok.i32" 4 32 "$T/ours_cuda.f32"
    "$PY" bench/hf_logits.py "$T/ck/step_00000020" "$T/tok.i32" 4 32 "$T/ours_cuda.f32"
fi
