#!/usr/bin/env bash
# test_generate_cli.sh BUILD — examples/generate.c: text from a checkpoint with a KV cache. The
# greedy text equals the one build/train samples by re-running the whole sequence (us_sample), also
# with the prompt in pieces and positions past --seq, and generate --no-cache's; a tokenizer.json's
# text; a Hugging Face checkpoint's ids against --no-cache's; refusals.
B=${1:-build}
G=$B/generate
R=$B/train
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
pass=0
fail=0
check() { # check NAME COMMAND...
    if eval "${@:2}"; then pass=$((pass + 1)); else fail=$((fail + 1)) && echo "  FAIL $1"; fi
}
# the sorting task's model, byte tokens; train samples "31415926=" greedily at the end
$R --steps 30 --save $W/ck --threads 1 --eval-every 0 --exact-match 16 --quiet --precision fp32 --sample 9 \
    --temperature 0 > $W/train.txt 2>&1
want=$(sed -n '/^sample (/{n;p;q}' $W/train.txt)
check 'train wrote a checkpoint and a sample' '[ -d $W/ck ] && [ ${#want} = 17 ]'
check 'greedy: the cached text equals train'"'"'s re-run sample' \
    '$G $W/ck --prompt "31415926=" --n 9 --temperature 0 --threads 1 > $W/g 2> $W/e &&
     [ "$(head -1 $W/g)" = "$want" ]'
check 'the speeds of prefill and decode on stderr' \
    'grep -q "^prefill: 9 tokens in .* tokens/s); decode: 9 tokens in .* tokens/s)" $W/e'
check 'the prompt in pieces of 4 and positions past --seq 4: the same text' \
    '$G $W/ck --prompt "31415926=" --n 9 --temperature 0 --seq 4 --threads 1 2> /dev/null |
     head -1 | grep -qx "$want"'
check '--no-cache (re-running for every token): the same greedy text, and 40 tokens past seq' \
    '$G $W/ck --prompt "31415926=" --n 40 --temperature 0 --seq 16 > $W/c1 2> /dev/null &&
     $G $W/ck --prompt "31415926=" --n 40 --temperature 0 --no-cache > $W/c2 2> $W/e &&
     cmp -s $W/c1 $W/c2 && head -1 $W/c1 | grep -qx "$want" && grep -q "no cache" $W/e'
check 'top-p sampling: the prompt first, the same text for the same seed' \
    '$G $W/ck --prompt "2718=" --n 30 --top-p 0.5 --seed 3 > $W/p1 2> /dev/null &&
     $G $W/ck --prompt "2718=" --n 30 --top-p 0.5 --seed 3 > $W/p2 2> /dev/null &&
     cmp -s $W/p1 $W/p2 && [ "$(head -c 5 $W/p1)" = "2718=" ] && [ $(wc -c < $W/p1) -gt 30 ]'
# a tokenizer.json model (tests/tok/gpt2.json, 1005 ids)
$R --data tests/tok/shakes.txt --tokenizer tests/tok/gpt2.json --steps 2 --seq 32 --dim 32 \
    --layers 1 --eval-every 0 --val-frac 0 --save $W/tk --quiet > /dev/null 2>&1
check 'with --tokenizer: the prompt'"'"'s text, then 8 tokens of text' \
    '$G $W/tk --tokenizer tests/tok/gpt2.json --prompt "First Citizen" --n 8 > $W/t 2> $W/e &&
     [ "$(head -c 13 $W/t)" = "First Citizen" ] && grep -q "decode: 8 tokens" $W/e'
# a Hugging Face Llama directory (tests/hf/llama32: 128256 ids, tied, llama3 RoPE scaling from an
# original context of 64) made from its seed, where python3 has safetensors and numpy
if python3 -c "import safetensors, numpy" 2> /dev/null &&
    python3 tests/hf_fixture.py weights tests/hf/llama32 $W/llama32 > /dev/null; then
    P='The quick brown fox jumps over the lazy dog; pack my box with five'
    check 'a Hugging Face checkpoint: cached ids = re-run ids, past position 64 (--ids)' \
        '$G $W/llama32 --prompt "$P" --n 6 --temperature 0 --ids --seq 16 --threads 1 > $W/h1 \
            2> /dev/null &&
         $G $W/llama32 --prompt "$P" --n 6 --temperature 0 --ids --no-cache --threads 1 > $W/h2 \
            2> /dev/null && cmp -s $W/h1 $W/h2 && [ $(wc -w < $W/h1) = 72 ]'
else
    echo "  (no python3 with safetensors and numpy: the Hugging Face case is not run)"
fi
check 'refused: an unknown option, in a sentence' \
    '! $G $W/ck --bogus 1 2> $W/e && grep -q "unknown option --bogus" $W/e'
check 'refused: a directory without a checkpoint' \
    '! $G $W/none 2> $W/e && grep -q "config.json" $W/e'
check 'refused: a prompt and --n past --max-len' \
    '! $G $W/ck --prompt "31415926=" --n 9 --max-len 12 2> $W/e && grep -q "exceed" $W/e'
check 'refused: --n -1' '! $G $W/ck --n -1 2> $W/e && grep -q "whole number" $W/e'
echo "test_generate_cli: $pass passed, $fail failed"
[ $fail = 0 ]
