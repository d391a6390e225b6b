#!/usr/bin/env bash
# test_tokenize_cli.sh BUILD — examples/tokenize.c: text into llm.c shards and back, ids equal to
# Hugging Face tokenizers' (tests/tok), uint16 and uint32 shards, refusals in a sentence; and
# build/train --tokenizer: the text encoded as tokenizers does, the samples decoded.
B=${1:-build}
T=$B/tokenize
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
pass=0
fail=0
check() { # check NAME COMMAND...
    if eval "${@:2}"; then pass=$((pass + 1)); else fail=$((fail + 1)) && echo "  FAIL $1"; fi
}
# uint32 → the ids in the shard, one per line (od: little-endian on x86 and ARM)
ids() { od -An -v -t "u$2" -j 1024 "$1" | tr -s ' ' '\n' | sed '/^$/d'; }
header() { od -An -v -t d4 -N 12 "$1" | tr -s ' ' ' ' | sed 's/^ //'; }

check 'tinyshakespeare slice: a uint16 shard of tokenizers ids' \
    '$T --tokenizer tests/tok/gpt2.json --out $W/s tests/tok/shakes.txt > $W/log &&
     [ "$(header $W/s_000000.bin)" = "20240520 1 $(wc -l < tests/tok/gpt2.shakes.ids)" ] &&
     ids $W/s_000000.bin 2 | cmp -s - tests/tok/gpt2.shakes.ids'
check 'the shard decodes to the text (through us_data_load_shard)' \
    '$T --tokenizer tests/tok/gpt2.json --decode $W/s_000000.bin | cmp -s - tests/tok/shakes.txt'
check 'two files, shards of 1000 tokens: the same ids in order' \
    '$T --tokenizer tests/tok/llama3.json --out $W/m --shard-tokens 1000 tests/tok/mixed.txt \
        tests/tok/shakes.txt > $W/log &&
     cat tests/tok/llama3.mixed.ids tests/tok/llama3.shakes.ids > $W/want &&
     for f in $W/m_*.bin; do ids $f 2; done | cmp -s - $W/want &&
     [ "$(header $W/m_000001.bin)" = "20240520 1 1000" ]'
# a vocabulary over 65536 ids: an added token with id 70000 → uint32 tokens, magic 20240801
python3 -c '
import json, sys
t = json.load(open("tests/tok/gpt2.json"))
t["added_tokens"].append({"id": 70000, "content": "<|big|>", "single_word": False,
    "lstrip": False, "rstrip": False, "normalized": False, "special": True})
json.dump(t, open(sys.argv[1], "w"))' $W/big.json
printf 'To be<|big|>, or not' > $W/big.txt
check 'ids over 65535: a uint32 shard that decodes back' \
    '$T --tokenizer $W/big.json --out $W/b $W/big.txt > $W/log &&
     [ "$(header $W/b_000000.bin | cut -d" " -f1,2)" = "20240801 7" ] &&
     ids $W/b_000000.bin 4 | grep -qx 70000 &&
     $T --tokenizer $W/big.json --decode $W/b_000000.bin | cmp -s - $W/big.txt'
: > $W/empty.txt
check 'refused: an empty text' \
    '! $T --tokenizer tests/tok/gpt2.json --out $W/e $W/empty.txt 2> $W/err > /dev/null &&
     grep -q "no text" $W/err && [ ! -e $W/e_000000.bin ]'
check 'refused: a missing tokenizer' \
    '! $T --tokenizer $W/none.json --out $W/e tests/tok/mixed.txt 2> $W/err &&
     grep -q "cannot open" $W/err'
check 'refused: a tokenizer.json it does not understand' \
    'sed "s/\"type\": \"BPE\"/\"type\": \"Unigram\"/" tests/tok/gpt2.json > $W/u.json &&
     ! $T --tokenizer $W/u.json --out $W/e tests/tok/mixed.txt 2> $W/err &&
     grep -q "not BPE" $W/err'
check 'refused: --shard-tokens 0, an unknown flag' \
    '! $T --tokenizer tests/tok/gpt2.json --shard-tokens 0 --out $W/e x 2> $W/err &&
     grep -q "between 1" $W/err && ! $T --bogus 2> /dev/null'
R=$B/train
small='--steps 2 --seq 32 --dim 32 --layers 1 --eval-every 0 --val-frac 0'
check 'train --tokenizer: the text as many tokens as tokenizers gives, the vocabulary its ids' \
    '$R --data tests/tok/shakes.txt --tokenizer tests/tok/gpt2.json $small --sample 8 > $W/t &&
     grep -q "^tokenizer: .*: $(wc -l < tests/tok/gpt2.shakes.ids) tokens$" $W/t &&
     grep -q "V=1005[,)]" $W/t'
check 'train --tokenizer: the sample decoded, its prompt the text'"'"'s first tokens' \
    '[ "$(sed -n "/^sample (/{n;p;q}" $W/t | head -c 8)" = "$(head -c 8 tests/tok/shakes.txt)" ]'
check 'train --tokenizer with a shard: its tokens as they are, the sample decoded' \
    '$R --data $W/s_000000.bin --tokenizer tests/tok/gpt2.json $small --sample 8 > $W/t2 &&
     [ "$(sed -n "/^sample (/{n;p;q}" $W/t2 | head -c 8)" = "$(head -c 8 tests/tok/shakes.txt)" ]'
check 'train refuses a vocabulary smaller than the tokenizer'"'"'s ids' \
    '! $R --data tests/tok/shakes.txt --tokenizer tests/tok/gpt2.json --vocab 1000 $small \
        2> $W/err > /dev/null && grep -q "has 1005 token ids but the model.s vocabulary is 1000" $W/err'
check 'train refuses --tokenizer without --data' \
    '! $R --tokenizer tests/tok/gpt2.json $small 2> $W/err > /dev/null && grep -q "needs --data" $W/err'
echo "test_tokenize_cli: $pass passed, $fail failed"
[ $fail = 0 ]
