#!/usr/bin/env bash
# The trainer's command line: flags, errors (one line + usage, exit 2), the JSONL log keys.
#   bash tests/test_train_cli.sh [BIN [PART]]
# PART runs one of the three parts (none: all): flags (flags, errors, the log, data, checkpoints),
# parallel (dp, tp, cp and pp against one rank), mesh (the 4D mesh, MoE and ep). make test runs
# them as three steps, side by side.
set -u
BIN=${1:-build/train}
PART=${2:-}
case $PART in '' | flags | parallel | mesh) ;; *) echo "test_train_cli: unknown part $PART" >&2; exit 2 ;; esac
part() { [ -z "$PART" ] || [ "$PART" = "$1" ]; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0; fail=0
ok()   { pass=$((pass + 1)); echo "  ok   $1"; }
bad()  { fail=$((fail + 1)); echo "  FAIL $1"; }
# expect CODE DESCRIPTION PATTERN -- ARGS...: exit code and a pattern in stdout+stderr
expect() {
    local code=$1 desc=$2 pat=$3; shift 4
    out=$("$BIN" "$@" 2>&1); rc=$?
    if [ "$rc" -eq "$code" ] && grep -qE -- "$pat" <<<"$out"; then ok "$desc"; else bad "$desc (exit $rc): $(head -c 300 <<<"$out")"; fi
}
small="--layers 1 --dim 32 --heads 2 --batch 2 --quiet"

# the loss curves compared: CURVE steps, 4 updates after the first (the library's tests compare
# every configuration step by step; these check that the flags reach it)
CURVE=5
# after training on the built-in task, the runs whose checks do not read its exact match decode
# one batch of problems (EXACT), not the default 200: the decoding still runs in every layout
EXACT="--exact-match 16"
# reference NAME -- ARGS...: the one-rank run the parallel ones are compared with (NAME.jsonl)
reference() {
    local name=$1; shift 2
    "$BIN" --steps $CURVE --eval-every 0 --quiet $EXACT --log "$T/$name.jsonl" "$@" > /dev/null 2>&1
}
# same_curve DESC REF NAME -- ARGS...: trains CURVE steps with ARGS (logging to NAME.jsonl) and
# checks each loss against the run REF.jsonl within 1e-4 relative
same_curve() {
    local desc=$1 ref=$2 name=$3 rc; shift 4
    "$BIN" --steps $CURVE --eval-every 0 --quiet $EXACT --log "$T/$name.jsonl" "$@" > "$T/$name.txt" 2>&1; rc=$?
    if [ "$rc" -eq 0 ] && python3 - "$T/$ref.jsonl" "$T/$name.jsonl" "$desc" $CURVE <<'PY'
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
n = int(sys.argv[4])
assert len(a) == len(b) == n, (len(a), len(b))
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print("  %s: %d losses within %.1e relative" % (sys.argv[3], n, worst))
assert worst < 1e-4, worst
PY
    then ok "$desc"; else bad "$desc (exit $rc) $(tail -3 "$T/$name.txt")"; fi
}

# ==== part flags: the flags, errors, the log, the data (the checkpoints at the end)
if part flags; then
expect 0 "--help prints the usage" "usage: train" -- --help
expect 2 "unknown flag" "unknown flag --bogus.*" -- --bogus 3
expect 2 "unknown flag also prints usage" "usage: train" -- --bogus 3
expect 2 "non-numeric value" "bad value for --steps: abc" -- --steps abc
expect 2 "trailing garbage in a number" "bad value for --lr: 0.1x" -- --lr 0.1x
expect 2 "negative batch" "bad value for --batch: -4" -- --batch -4
expect 2 "missing value" "missing value for --seq" -- --seq
expect 2 "bad precision" "--precision must be fp32, bf16, fp16, fp8 or fp8-tensor, got fp12" -- --precision fp12
expect 2 "negative loss scale" "bad value for --loss-scale: -1" -- --loss-scale -1
expect 2 "zero loss-scale window" "bad value for --loss-scale-window: 0" -- --loss-scale-window 0
expect 2 "--fp8-pow2 without fp8" "fp8_pow2 applies to the fp8 and fp8-tensor precisions only" -- --fp8-pow2
expect 0 "--precision fp8 --fp8-pow2 runs, reports the FP8 linears" "fp8: 4 of 4 linear layers in FP8 E4M3 .*powers of two" -- --layers 1 --dim 32 --heads 2 --batch 16 --steps 2 --eval-every 0 $EXACT --sample 0 --precision fp8 --fp8-pow2 --fp8-min-dim 16
expect 0 "fp8 below the size rule keeps every linear in bf16" "fp8: 0 of 4 linear layers in FP8 E4M3 .*under --fp8-min-dim 1536" -- --layers 1 --dim 32 --heads 2 --batch 16 --steps 2 --eval-every 0 $EXACT --sample 0 --precision fp8
expect 0 "--fp8-min-dim=32 takes this model's linears" "fp8: 4 of 4 linear layers in FP8 E4M3 .*under --fp8-min-dim 32" -- --layers 1 --dim 32 --heads 2 --batch 16 --steps 2 --eval-every 0 $EXACT --sample 0 --precision fp8 --fp8-min-dim=32
expect 2 "--fp8-min-dim without fp8" "fp8_min_dim applies to the fp8 and fp8-tensor precisions only" -- --fp8-min-dim 64
expect 2 "--fp8-min-dim 0" "--fp8-min-dim" -- --precision fp8 --fp8-min-dim 0
expect 2 "--fp8-experts without fp8" "fp8_experts applies to the fp8 and fp8-tensor precisions only" -- --experts 4 --fp8-experts
expect 0 "fp8 MoE keeps the experts in bf16 unless --fp8-experts" "MoE experts in bf16 \(--fp8-experts\)" -- --layers 1 --dim 32 --heads 2 --batch 16 --steps 1 --eval-every 0 $EXACT --sample 0 --precision fp8 --experts 4
expect 0 "--fp8-experts takes them" "MoE experts by the same rule, per expert" -- --layers 1 --dim 32 --heads 2 --batch 16 --steps 1 --eval-every 0 $EXACT --sample 0 --precision fp8 --experts 4 --fp8-experts
expect 0 "--precision fp8-tensor runs" "fp8: 4 of 4 linear layers in FP8 E4M3 \\(per-tensor" -- --layers 1 --dim 32 --heads 2 --batch 16 --steps 2 --eval-every 0 $EXACT --sample 0 --precision fp8-tensor --fp8-min-dim 16
expect 0 "fp8 keeps the quantised weights for the step" "weights quantised once per step \\(cache" -- --layers 1 --dim 32 --heads 2 --batch 16 --steps 2 --eval-every 0 $EXACT --sample 0 --precision fp8 --fp8-min-dim 16
expect 0 "--fp8-no-weight-cache quantises at every GEMM" "weights quantised at every GEMM" -- --layers 1 --dim 32 --heads 2 --batch 16 --steps 2 --eval-every 0 $EXACT --sample 0 --precision fp8 --fp8-no-weight-cache --fp8-min-dim 16
expect 2 "--fp8-no-weight-cache without fp8" "fp8_no_wcache applies to the fp8 and fp8-tensor precisions only" -- --fp8-no-weight-cache
expect 2 "bad recompute mode" "--recompute must be none, selective or full" -- --recompute some
expect 2 "heads not dividing dim" "dim=64 not divisible by heads=3" -- --heads 3
expect 2 "kv-heads not dividing heads" "heads=4 not divisible by kv-heads=3" -- --kv-heads 3
expect 2 "task needs a long enough sequence" "needs --seq of at least" -- --seq 8
expect 2 "bad --device" "--device must be cpu or cuda, got tpu" -- --device tpu
if [ "$(basename "$BIN")" = train ]; then expect 2 "--device cuda in the CPU build" "no CUDA backend" -- --device cuda; fi
expect 1 "missing data file" "cannot open $T/none.txt" -- --data "$T/none.txt"

# ---- papercuts a new user hit (issue 24)
expect 2 "an unknown flag given last is unknown, not missing its value" "unknown flag --bogus" -- --steps 3 --bogus
expect 2 "a flag without a value still says so" "missing value for --steps" -- --steps
"$BIN" --layers=1 --dim=32 --heads=2 --batch=2 --quiet --steps=3 --eval-every=0 --log="$T/eq.jsonl" > "$T/eq.txt" 2>&1; rc=$?
if [ "$rc" -eq 0 ] && [ "$(wc -l < "$T/eq.jsonl")" -eq 3 ]; then ok "--flag=value (--steps=3 ... trains 3 steps)"; else bad "--flag=value (exit $rc): $(tail -2 "$T/eq.txt")"; fi
expect 2 "--flag=value checks the value" "bad value for --steps: 5x" -- --steps=5x
expect 2 "a switch given a value is refused" "--quiet takes no value, got --quiet=1" -- --quiet=1
expect 1 "--data on a directory: one sentence" "^train: cannot read $T: Is a directory\$" -- --data "$T"
expect 1 "--data /dev/zero is not a regular file" "^train: /dev/zero is not a regular file \(it has no size but reads data\): copy it into one\$" -- --data /dev/zero
expect 1 "--data on a /proc file is not a regular file" "/proc/self/status is not a regular file" -- --data /proc/self/status
expect 2 "--grad-accum and --micro-batches that disagree are refused" "--grad-accum 2 and --micro-batches 4 disagree: both set the micro-batches per step; give one" \
    -- --grad-accum 2 --micro-batches 4
expect 0 "--grad-accum and --micro-batches that agree are one setting" "accum=2" -- --layers 1 --dim 32 --heads 2 --batch 2 --grad-accum 2 --micro-batches 2 --steps 1 --eval-every 0 $EXACT --sample 0
mkdir -p "$T/adir"; : > "$T/afile"
expect 2 "--trace into a missing directory is refused before training" "^train: cannot write --trace $T/no/such/t.json: No such file or directory\$" \
    -- --trace "$T/no/such/t.json" --steps 1
expect 2 "--trace naming a directory is refused" "--trace $T/adir is a directory" -- --trace "$T/adir" --steps 1
[ ! -e "$T/t_ok.json" ] && "$BIN" $small --steps 1 --eval-every 0 $EXACT --sample 0 --trace "$T/t_ok.json" > /dev/null 2>&1 && grep -q traceEvents "$T/t_ok.json" &&
    ok "a good --trace path still gets its trace" || bad "a good --trace path"
expect 2 "--save onto a file is refused before training" "--save $T/afile exists and is not a directory" -- --save "$T/afile" --steps 1
# OpenMP's waiting threads spin briefly, then sleep, unless the user chose (long-spinning ones
# crawl on a busy machine): the running trainer's environment says passive with a spin count of
# 10000, or what the user set
omp_policy() {   # omp_policy [VAR=VALUE]: "OMP_WAIT_POLICY GOMP_SPINCOUNT" of a running trainer
    local pid k pol='' spin='' bin
    bin=$(readlink -f "$BIN")
    env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT "$@" "$BIN" --steps 100000 --eval-every 0 --quiet \
        > /dev/null 2>&1 & pid=$!
    for k in $(seq 50); do   # (until env has become the trainer: env's own environment is ours)
        if [ "$(readlink /proc/$pid/exe 2>/dev/null)" = "$bin" ]; then
            pol=$(tr '\0' '\n' < /proc/$pid/environ 2>/dev/null | sed -n 's/^OMP_WAIT_POLICY=//p')
            spin=$(tr '\0' '\n' < /proc/$pid/environ 2>/dev/null | sed -n 's/^GOMP_SPINCOUNT=//p')
            [ -n "$pol" ] && break
        fi
        sleep 0.1
    done
    kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
    echo "$pol ${spin:--}"
}
if [ -r /proc/self/environ ]; then
    p1=$(omp_policy); p2=$(omp_policy OMP_WAIT_POLICY=active)
    [ "$p1" = "passive 10000" ] && ok "OMP_WAIT_POLICY passive, GOMP_SPINCOUNT 10000 by default" ||
        bad "OpenMP's wait by default: '$p1'"
    [ "$p2" = "active -" ] && ok "... and what the user set otherwise" || bad "OMP_WAIT_POLICY=active kept: '$p2'"
fi

# a short run with the JSONL log
"$BIN" $small --steps 6 --eval-every 3 --log "$T/log.jsonl" > "$T/out.txt" 2>&1; rc=$?
if [ "$rc" -eq 0 ] && [ "$(wc -l < "$T/log.jsonl")" -eq 6 ]; then ok "6 steps write 6 JSON lines"; else bad "short run (exit $rc) $(tail -3 "$T/out.txt")"; fi
if command -v python3 >/dev/null 2>&1; then
    if python3 - "$T/log.jsonl" <<'PY'
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
need = ["step", "loss", "lr", "grad_norm", "tok_s", "mfu", "mem_bytes", "rss_peak_bytes"]
assert all(all(k in r for k in need) for r in rows), "missing keys"
assert [r["step"] for r in rows] == list(range(1, 7))
assert all(math.isfinite(r["loss"]) and r["tok_s"] > 0 and r["mem_bytes"] > 0 for r in rows)
# the process's resident peak holds at least the library's allocations, and never falls
assert all(r["rss_peak_bytes"] >= r["mem_bytes"] for r in rows)
assert all(a["rss_peak_bytes"] <= b["rss_peak_bytes"] for a, b in zip(rows, rows[1:]))
assert "eval_acc" in rows[2] and "eval_acc" not in rows[0]
PY
    then ok "JSONL parses with keys step, loss, lr, grad_norm, tok_s, mfu, mem_bytes, rss_peak_bytes"; else bad "JSONL content"; fi
else
    if grep -q '"grad_norm"' "$T/log.jsonl" && grep -q '"mem_bytes"' "$T/log.jsonl"; then ok "JSONL keys present"; else bad "JSONL keys"; fi
fi
grep -q "sorting exact match on 200 held-out problems" "$T/out.txt" && ok "the task reports exact-match accuracy" || bad "no exact-match line"
"$BIN" $small --steps 1 --eval-every 0 --exact-match 0 > "$T/ex0.txt" 2>&1 && grep -q "^trained 1 steps" "$T/ex0.txt" &&
    ! grep -q "exact match" "$T/ex0.txt" && ok "--exact-match 0 decodes no problems" || bad "--exact-match 0: $(tail -2 "$T/ex0.txt")"

# --data evaluations score fixed non-overlapping windows: with a learning rate too small to move
# the model, every evaluation gives the same number, and so do dp 2 and tp 2
python3 -c "
import random
r = random.Random(5)
w = ['the', 'king', 'shall', 'not', 'sleep', 'tonight', 'and', 'she', 'said', 'so', 'good', 'lord']
print('\n'.join(' '.join(r.choice(w) for _ in range(r.randint(3, 12))) for _ in range(1500)))
" > "$T/ev.txt"
evrun() { "$BIN" --data "$T/ev.txt" --layers 1 --dim 32 --heads 2 --batch 4 --seq 64 --lr 1e-12 \
    --steps 3 --eval-every 1 --eval-tokens 3200 --log "$T/$1.jsonl" "${@:2}" > "$T/$1.txt" 2>&1; }
evrun ev1 && evrun evdp --dp 2 && evrun evtp --tp 2 && python3 - "$T/ev1.jsonl" "$T/evdp.jsonl" "$T/evtp.jsonl" <<'PY'
import json, sys
runs = [[json.loads(l)["eval_loss"] for l in open(f)] for f in sys.argv[1:]]
base = runs[0][0]
assert all(len(r) == 3 for r in runs), runs
assert all(abs(x - base) <= 1e-6 * base for r in runs for x in r), runs
PY
[ $? -eq 0 ] && grep -q "^evaluation: 50 windows of 64 tokens" "$T/ev1.txt" &&
    ok "--eval-tokens 3200: 50 fixed windows; every evaluation, dp 2 and tp 2 give one number" ||
    bad "fixed-window evaluation ($(grep -h eval "$T"/ev*.txt | head -3))"

# --eval-choices: a made-up multiple-choice file (HellaSwag's JSONL) whose right endings are the
# training text's own continuations: learned, every answer is right; a frozen model scores every
# candidate the same under dp 2, tp 2 and cp 2; malformed files are refused with the line
python3 - "$T" <<'PY'
import json, random, sys
r = random.Random(3)
subj = ["the red fox", "a blue owl", "my old dog", "the tall man", "her small cat",
        "our green frog", "the quiet girl", "a brave knight"]
pred = ["jumps over walls", "sleeps until noon", "barks at the moon", "reads thick books",
        "chases grey mice", "sings in the rain", "paints the sky", "rides a white horse"]
lines = [subj[i] + " " + pred[i] + "." for i in range(8)]
open(sys.argv[1] + "/mc.txt", "w").write("\n".join(r.choice(lines) for _ in range(3000)) + "\n")
with open(sys.argv[1] + "/mc.jsonl", "w") as f:
    for i in range(8):
        ends = [p + "." for j, p in enumerate(pred) if j != i]
        r.shuffle(ends)
        lab = r.randrange(4)
        ends = ends[:3]
        ends.insert(lab, pred[i] + ".")
        f.write(json.dumps({"ind": i, "ctx": subj[i], "endings": ends, "label": lab,
                            "split": "val", "ctx_a": {"nested": [1, 2.5e3, None, True]}}) + "\n")
# escapes and a surrogate pair: read, not refused
open(sys.argv[1] + "/mcesc.jsonl", "w").write(
    '{"ctx": "caf\\u00e9 \\"q\\" \\ud83d\\ude00\\n", "endings": ["a.", "b\\t."], "label": 1}\n')
open(sys.argv[1] + "/mcbad1.jsonl", "w").write('{"ctx": "x", "endings": ["a", "b"], "label": 1}\n{"ctx": "x", "endings": ["a", "b"]\n')
open(sys.argv[1] + "/mcbad2.jsonl", "w").write('{"ctx": "x", "endings": ["a", "b"], "label": 2}\n')
PY
mcrun() { "$BIN" --data "$T/mc.txt" --layers 1 --dim 48 --heads 4 --seq 48 --batch 8 --eval-every 0 \
    --eval-choices "$T/mc.jsonl" "$@" 2>&1 | grep "^multiple choice"; }
mc_learn=$(mcrun --steps 120 --lr 1e-2)
[[ "$mc_learn" == *"(8 of 8)"* ]] &&
    ok "--eval-choices: after training on the text, the 8 made-up examples all right ($mc_learn)" ||
    bad "--eval-choices after training: $mc_learn"
mc1=$(mcrun --steps 1 --lr 1e-12); mcd=$(mcrun --steps 1 --lr 1e-12 --dp 2)
mct=$(mcrun --steps 1 --lr 1e-12 --tp 2); mcc=$(mcrun --steps 1 --lr 1e-12 --cp 2)
[ -n "$mc1" ] && [ "$mc1" = "$mcd" ] && [ "$mc1" = "$mct" ] && [ "$mc1" = "$mcc" ] &&
    ok "--eval-choices: one rank, dp 2, tp 2 and cp 2 score alike ($mc1)" ||
    bad "--eval-choices across layouts: '$mc1' '$mcd' '$mct' '$mcc'"
"$BIN" --data "$T/mc.txt" --steps 1 --eval-every 0 --eval-choices "$T/mcesc.jsonl" 2>&1 |
    grep -q "^multiple choice: acc_norm .* of 1)" &&
    ok "--eval-choices: JSON escapes and a surrogate pair are read" || bad "--eval-choices escapes"
expect 2 "--eval-choices: a malformed line is refused with its number" "mcbad1.jsonl line 2: " -- \
    --data "$T/mc.txt" --steps 1 --eval-choices "$T/mcbad1.jsonl"
expect 2 "--eval-choices: a label past the endings is refused" "line 1: a label past the endings" -- \
    --data "$T/mc.txt" --steps 1 --eval-choices "$T/mcbad2.jsonl"
expect 2 "--eval-choices with --pp is refused in one sentence" "drop --pp for it" -- \
    --data "$T/mc.txt" --steps 1 --pp 2 --layers 2 --eval-choices "$T/mc.jsonl"
"$BIN" --layers 1 --dim 32 --heads 2 --batch 2 --steps 2 --eval-every 0 $EXACT > "$T/mem.txt" 2>&1
grep -q "^memory: allocator peak .* MiB/rank, estimate .* MiB/rank, process peak RSS .* MiB" "$T/mem.txt" &&
    ok "the run ends with its memory: allocator peak, estimate, process peak RSS" || bad "no memory line"

# fp16 with dynamic loss scaling: the log's loss_scale / skipped keys; a static scale too large
# for fp16 skips every step (S stays) and updates nothing
"$BIN" --layers 1 --dim 32 --heads 2 --batch 2 --steps 4 --eval-every 0 $EXACT --precision fp16 --log "$T/fp16.jsonl" > "$T/fp16.txt" 2>&1; rc=$?
"$BIN" $small --steps 3 --eval-every 0 $EXACT --precision fp16 --loss-scale 1099511627776 --log "$T/fp16s.jsonl" > "$T/fp16s.txt" 2>&1; rc2=$?
if [ "$rc" -eq 0 ] && [ "$rc2" -eq 0 ] && grep -q "loss scale 65536 | skipped 0/0" "$T/fp16.txt" && grep -q "trained 0 steps" "$T/fp16s.txt" && python3 - "$T/fp16.jsonl" "$T/fp16s.jsonl" "$T/log.jsonl" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
c = [json.loads(l) for l in open(sys.argv[3])]
assert len(a) == 4 and all(r["loss_scale"] == 65536 and r["skipped"] == 0 and r["skipped_total"] == 0 for r in a)
assert [r["step"] for r in a] == [1, 2, 3, 4]
assert [(r["skipped"], r["skipped_total"], r["loss_scale"]) for r in b] == [(1, 1, 2**40), (1, 2, 2**40), (1, 3, 2**40)], b
assert all(r["step"] == 0 and r["grad_norm"] is None for r in b)
assert all("loss_scale" not in r for r in c), "no loss scaling keys under fp32"
PY
then ok "--precision fp16: loss_scale 65536, skipped 0/0; a static --loss-scale 2^40 skips every step (skipped 1, skipped_total 1..3, grad_norm null)"; else bad "fp16 runs (exit $rc $rc2) $(tail -2 "$T/fp16.txt") $(tail -2 "$T/fp16s.txt")"; fi

# raw text data, with sampling, bf16 and recomputation
head -c 3000 /dev/urandom | base64 > "$T/text.txt"
expect 0 "raw text training with --sample" "sample \(" -- $small --steps 3 --seq 16 --data "$T/text.txt" --sample 8 --precision bf16 --recompute full
expect 0 "raw text: the last 10% held out for the evaluations by default" "data: [0-9]+ tokens to train on, the last [0-9]+ held out" -- --layers 1 --dim 32 --heads 2 --batch 2 --steps 2 --seq 16 --data "$T/text.txt"
expect 0 "--val-frac 0 evaluates on the training tokens" "data: [0-9]+ tokens to train on, the evaluations read them too" -- --layers 1 --dim 32 --heads 2 --batch 2 --steps 2 --seq 16 --data "$T/text.txt" --val-frac 0
expect 2 "--val-frac leaving too few tokens to train on" "each needs seq\+1 = 1025" -- $small --steps 1 --seq 1024 --data "$T/text.txt" --val-frac 0.9
# an llm.c shard whose tokens exceed the vocabulary
python3 -c "
import struct
h = [0]*256; h[0] = 20240520; h[1] = 1; h[2] = 100
open('$T/s.bin','wb').write(struct.pack('<256i', *h) + struct.pack('<100H', *[i*300 % 50000 for i in range(100)]))" 2>/dev/null
if [ -f "$T/s.bin" ]; then
    expect 2 "shard tokens beyond --vocab" "set --vocab" -- $small --steps 1 --seq 16 --data "$T/s.bin"
    expect 0 "shard with a large enough vocabulary" "trained 1 steps" -- $small --steps 1 --seq 16 --vocab 50000 --data "$T/s.bin"
fi
head -c 1000 "$T/s.bin" > "$T/trunc.bin" 2>/dev/null && expect 1 "truncated shard" "truncated" -- $small --data "$T/trunc.bin"

# ---- llm.c shards through the loader (us_loader): lists, globs, validation shards, resume
python3 -c "
import struct
def shard(name, toks):
    h = [0]*256; h[0] = 20240520; h[1] = 1; h[2] = len(toks)
    open(name, 'wb').write(struct.pack('<256i', *h) + struct.pack('<%dH' % len(toks), *toks))
for i, n in enumerate([301, 250, 190]):
    shard('$T/sh_train_%d.bin' % i, [(i * 97 + j * 31 + (j * j) % 7) % 256 for j in range(n)])
shard('$T/sh_val_0.bin', [(j * 13) % 256 for j in range(120)])"
# 44 windows of 17 per epoch (18 + 15 + 11); 8 a step, so 12 steps read two epochs and more
sh="--layers 1 --dim 32 --heads 2 --batch 4 --grad-accum 2 --seq 16 --threads 1 --eval-every 0"
expect 0 "a glob of shards: the one named val is the validation shard" "data: 3 shards, 741 tokens to train on \(44 windows of 17 per epoch, shuffled\), 1 validation shard" -- $sh --steps 1 --data "$T/sh_*.bin"
expect 0 "a list of shards without a validation shard: the tail is held out" "data: 2 shards, 496 tokens to train on .*the last 55 held out" -- $sh --steps 1 --data "$T/sh_train_0.bin,$T/sh_train_1.bin"
expect 0 "--val-data names the validation shards" "1 validation shard for the evaluations" -- $sh --steps 1 --data "$T/sh_train_*.bin" --val-data "$T/sh_val_0.bin"
expect 2 "--val-frac beside validation shards is refused" "give one" -- $sh --steps 1 --data "$T/sh_*.bin" --val-frac 0.1
expect 2 "--val-data beside raw text is refused" "text.txt is not an llm.c token shard" -- $sh --steps 1 --data "$T/text.txt" --val-data "$T/sh_val_0.bin"
expect 2 "a pattern that matches no file is refused" "matches no file" -- $sh --steps 1 --data "$T/none_*.bin"
expect 1 "a truncated shard in the list is refused, named" "trunc.bin is truncated" -- $sh --steps 1 --data "$T/sh_train_0.bin,$T/trunc.bin"
# stopped at step 4 (in the first epoch) or 8 (in the second) and resumed: the same batches, so
# the same losses and, at step 12, the same weights byte for byte; under --dp 2 as well
shrun() { local name=$1; shift; "$BIN" $sh --quiet --data "$T/sh_*.bin" --log "$T/$name.jsonl" "$@" > "$T/$name.txt" 2>&1; }
shrun sha --steps 12 --save "$T/sck" --save-every 4 --keep 0 && shrun shb --steps 12 --resume "$T/sck/step_00000004" --save "$T/sck4" &&
    shrun shc --steps 12 --resume "$T/sck/step_00000008" --save "$T/sck8"; rc=$?
if [ "$rc" -eq 0 ] && grep -q '"loader": {"epoch": 1' "$T/sck/step_00000008/trainer_state.json" &&
    diff <(tail -8 "$T/sha.jsonl" | cut -d, -f1,2) <(cut -d, -f1,2 "$T/shb.jsonl") > /dev/null &&
    diff <(tail -4 "$T/sha.jsonl" | cut -d, -f1,2) <(cut -d, -f1,2 "$T/shc.jsonl") > /dev/null &&
    cmp -s "$T/sck/step_00000012/model.safetensors" "$T/sck4/step_00000012/model.safetensors" &&
    cmp -s "$T/sck/step_00000012/model.safetensors" "$T/sck8/step_00000012/model.safetensors"
then ok "shards: runs resumed at step 4 and 8 (epoch 2) read the same batches: same losses, same weights"; else bad "shard resume (exit $rc): $(tail -n 2 "$T/shb.txt" "$T/shc.txt")"; fi
shrun shd --steps 12 --dp 2 --save "$T/sckd" --save-every 4 --keep 0 && shrun she --steps 12 --dp 2 --resume "$T/sckd/step_00000004" --save "$T/scke"; rc=$?
if [ "$rc" -eq 0 ] && cmp -s "$T/sckd/step_00000012/model.safetensors" "$T/scke/step_00000012/model.safetensors" && python3 - "$T/sha.jsonl" "$T/shd.jsonl" <<'PY'
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
assert len(a) == len(b) == 12 and max(abs(x - y) / x for x, y in zip(a, b)) < 1e-5, (a, b)
PY
then ok "shards under --dp 2: the loss curve of one rank, and a resume under dp 2 ends with the same weights"; else bad "shards dp 2 (exit $rc): $(tail -2 "$T/she.txt")"; fi
expect 1 "--resume with other shards is refused" "give the same --data" -- $sh --steps 12 --data "$T/sh_train_0.bin,$T/sh_train_1.bin" --resume "$T/sck/step_00000004"
expect 1 "--resume of a shard run on raw text is refused" "saved by a run over token shards" -- $sh --steps 12 --data "$T/text.txt" --resume "$T/sck/step_00000004"

fi # part flags

# ==== part parallel: dp, tp, cp and pp, each against one rank
if part parallel; then
# data parallelism on CPU threads: flags, errors, and the loss curve of --dp 1
expect 2 "batch not divisible by dp" "--batch 16 is not divisible by --dp 3" -- --dp 3
expect 2 "bad ZeRO stage" "bad value for --zero: 4" -- --zero 4
expect 2 "--nproc is for GPUs" "--nproc starts one process per GPU" -- --nproc 2
expect 2 "bad bucket size" "bad value for --bucket-mb: 0" -- --bucket-mb 0
reference dp1 --
same_curve "--dp 4 --zero 3 trains the task to the loss curve of --dp 1" dp1 dp4 -- --dp 4 --zero 3 --trace "$T/trace.json"
same_curve "--loss-chunk 24 (the head by 24 rows) trains to the loss curve of the whole logits" dp1 lc -- --loss-chunk 24
expect 2 "--loss-chunk with ZeRO-2 is refused" "loss_chunk=8 needs pp 1 and ZeRO below 2" -- --loss-chunk 8 --dp 2 --zero 2
expect 2 "bad --loss-chunk" "bad value for --loss-chunk: -2" -- --loss-chunk -2
for f in --loss-chunk --fp8-min-dim --overlap-sms; do   # (these once crashed when given last)
    expect 2 "$f given last asks for its value" "missing value for $f" -- $f
done
if python3 - "$T/trace.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))["traceEvents"]
pids = {e["pid"] for e in t if e["ph"] == "X"}
rows = {(e["pid"], e["tid"]) for e in t if e["ph"] == "X"}
assert pids == {0, 1, 2, 3}, pids
assert all((p, 1) in rows and (p, 0) in rows for p in pids)
PY
then ok "--trace writes one process row per rank with compute and comm rows"; else bad "--trace file"; fi

# tensor parallelism: flags, errors, and the loss curve of one rank
expect 2 "tp must divide the heads" "tp=3 must divide heads=4" -- --tp 3
expect 2 "sp needs tp" "it needs tp > 1" -- --sp
same_curve "--dp 2 --tp 2 --sp --zero 1 trains the task to the loss curve of one rank" dp1 tp -- --dp 2 --tp 2 --sp --zero 1

# context parallelism
expect 2 "cp needs the sequence to split" "must split into 8 equal chunks for cp=4" -- --cp 4 --seq 36
expect 2 "bad cp mode" "--cp-mode must be ring, zigzag or allgather, got spiral" -- --cp-mode spiral
reference cp1 -- --seq 72
same_curve "--cp 2 --dp 2 --zero 1 trains the task to the loss curve of one rank" cp1 cp -- --seq 72 --cp 2 --dp 2 --zero 1

# pipeline parallelism
expect 2 "pp needs a layer per stage" "pp=3 exceeds layers=2" -- --pp 3
expect 2 "unknown schedule" "must be afab, 1f1b, interleaved, interleaved-bf, zb1, zbv, dualpipev or dualpipe, got gpipe" -- --pp 2 --pp-schedule gpipe
expect 2 "interleaved needs a layer per stage" "pp=2 x 2 chunks = 4 pipeline stages exceed layers=2" -- --pp 2 --pp-schedule interleaved
expect 2 "bad --grad-reduce-dtype" "--grad-reduce-dtype must be fp32 or bf16, got fp8" -- --grad-reduce-dtype fp8
expect 2 "chunks only for interleaved" "applies to the interleaved and V-shaped schedules only" -- --pp 2 --pp-chunks 2
reference pp1 -- --grad-accum 4
same_curve "--pp 2 --dp 2 (1F1B, 4 micro-batches) trains the task to the loss curve of one rank" pp1 pp -- --grad-accum 4 --pp 2 --dp 2
same_curve "--pp 2 --pp-schedule zb1 --micro-batches 4 trains the task to the loss curve of one rank" pp1 zb -- --micro-batches 4 --pp 2 --pp-schedule zb1
same_curve "--pp 2 --pp-schedule zb1 --recompute full --dp 2 --zero 3 (FSDP + PP) trains the task to the loss curve of one rank" pp1 zbz3 -- --micro-batches 4 --pp 2 --pp-schedule zb1 --recompute full --dp 2 --zero 3
# FSDP + PP checkpoints: saved by dp 2 x pp 2 ZeRO-3 (interleaved) at step 2, resumed in that
# layout (the same weights at step 4, byte for byte) and on one rank: the uninterrupted losses
z3="--steps 4 --eval-every 0 --quiet --layers 4 --micro-batches 2 $EXACT"
z3pp="--pp 2 --dp 2 --zero 3 --pp-schedule interleaved"
"$BIN" $z3 $z3pp --save "$T/z3" --save-every 2 --keep 0 --log "$T/z3a.jsonl" > "$T/z3a.txt" 2>&1 &&
    "$BIN" $z3 $z3pp --resume "$T/z3/step_00000002" --save "$T/z3b" --log "$T/z3b.jsonl" > "$T/z3b.txt" 2>&1 &&
    "$BIN" $z3 --resume "$T/z3/step_00000002" --log "$T/z3c.jsonl" > "$T/z3c.txt" 2>&1; rc=$?
if [ "$rc" -eq 0 ] && diff <(tail -2 "$T/z3a.jsonl" | cut -d, -f1,2) <(cut -d, -f1,2 "$T/z3b.jsonl") > /dev/null &&
    diff <(tail -2 "$T/z3a.jsonl" | cut -d, -f1,2) <(cut -d, -f1,2 "$T/z3c.jsonl") > /dev/null &&
    cmp -s "$T/z3/step_00000004/model.safetensors" "$T/z3b/step_00000004/model.safetensors"
then ok "a dp 2 x pp 2 ZeRO-3 checkpoint resumes in its layout (same weights) and on one rank (same losses)"; else bad "ZeRO-3 pp resume (exit $rc): $(tail -n 2 "$T/z3b.txt" "$T/z3c.txt")"; fi
if grep -q '"pp_bubble": 0\.[0-9]' "$T/zb.jsonl" 2>/dev/null; then ok "the pipeline log has pp_bubble"; else bad "the pipeline log has pp_bubble"; fi
# DualPipe: refusals in one sentence; two pipelines fed from both ends train like one rank; a
# checkpoint (ranks q and pp-1-q write the same stages alike) resumes in its layout, the same
# weights byte for byte, and on one rank, the same losses
expect 2 "dualpipe needs an even pp" "dualpipe needs an even pp.*\(pp=3\)" -- --layers 4 --pp 3 --pp-schedule dualpipe --micro-batches 6
expect 2 "dualpipe needs an even number of micro-batches, at least 2 x pp" "at least 2\*pp \(micro-batches=3, pp=2\)" -- --pp 2 --pp-schedule dualpipe --micro-batches 3
same_curve "--pp 2 --pp-schedule dualpipe --micro-batches 4 (the weights twice) trains the task to the loss curve of one rank" pp1 dualpipe -- --micro-batches 4 --pp 2 --pp-schedule dualpipe
dpp="--steps 4 --eval-every 0 --quiet $EXACT --layers 4 --micro-batches 8 --pp 4 --pp-schedule dualpipe"
"$BIN" $dpp --save "$T/dpp" --save-every 2 --keep 0 --log "$T/dppa.jsonl" > "$T/dppa.txt" 2>&1 &&
    "$BIN" $dpp --resume "$T/dpp/step_00000002" --save "$T/dppb" --log "$T/dppb.jsonl" > "$T/dppb.txt" 2>&1 &&
    "$BIN" ${dpp%--pp 4*} --resume "$T/dpp/step_00000002" --log "$T/dppc.jsonl" > "$T/dppc.txt" 2>&1; rc=$?
if [ "$rc" -eq 0 ] && diff <(tail -2 "$T/dppa.jsonl" | cut -d, -f1,2) <(cut -d, -f1,2 "$T/dppb.jsonl") > /dev/null &&
    diff <(tail -2 "$T/dppa.jsonl" | cut -d, -f1,2) <(cut -d, -f1,2 "$T/dppc.jsonl") > /dev/null &&
    cmp -s "$T/dpp/step_00000004/model.safetensors" "$T/dppb/step_00000004/model.safetensors"
then ok "a pp 4 dualpipe checkpoint resumes in its layout (same weights) and on one rank (same losses)"; else bad "dualpipe resume (exit $rc): $(tail -n 2 "$T/dppb.txt" "$T/dppc.txt")"; fi
fi # part parallel

# ==== part mesh: the 4D mesh, mixture of experts, expert parallelism
if part mesh; then
# all four dimensions at once on 16 threads (issue 13's 5D mesh, less ep): dp 2 x pp 2 x cp 2 x tp 2
reference m1 -- --grad-accum 2 --seq 64 --layers 4
same_curve "--dp 2 --pp 2 --cp 2 --tp 2 (16 threads) trains the task to the loss curve of one rank" m1 mesh4 -- --grad-accum 2 --seq 64 --layers 4 --dp 2 --pp 2 --cp 2 --tp 2
# mixture of experts: flags, errors, a MoE run that learns, the router statistics in the log
expect 2 "--top-k needs --experts" "need --experts E \(sampling's top-k is --sample-top-k\)" -- --top-k 2
expect 2 "bad --moe-gate" "--moe-gate must be softmax or sigmoid, got relu" -- --experts 4 --moe-gate relu
expect 2 "bad --moe-balance" "--moe-balance must be bias, aux or none, got lossy" -- --experts 4 --moe-balance lossy
expect 2 "top-k above the experts" "moe top-k=5 must be in 1..experts=4" -- --experts 4 --top-k 5
expect 2 "groups must divide the experts" "moe groups=4 must divide experts=6" -- --experts 6 --moe-groups 4
# expert parallelism: errors in one sentence, and the loss curve of one rank
expect 2 "ep must divide dp x cp" "ep=3 must divide dp x cp = 2" -- --experts 4 --dp 2 --ep 3
expect 2 "ep must divide the experts" "ep=4 must divide experts=6" -- --experts 6 --dp 4 --ep 4
expect 2 "ep needs experts" "expert parallelism \(ep=2\) needs a MoE model" -- --dp 2 --ep 2
reference moe1 -- --experts 4 --threads 1 --layers 1 --dim 32 --heads 2
same_curve "--experts 4 --dp 2 --ep 2 trains the task to the loss curve of one rank" moe1 ep -- --experts 4 --layers 1 --dim 32 --heads 2 --dp 2 --ep 2
same_curve "--experts 4 --dp 2 --ep 2 --zero 2 (experts sharded over their replicas) trains to the loss curve of one rank" moe1 epz -- --experts 4 --layers 1 --dim 32 --heads 2 --dp 2 --ep 2 --zero 2
expect 2 "bad capacity factor" "bad value for --capacity-factor: -1" -- --experts 4 --capacity-factor -1
expect 2 "forced balance needs experts" "moe_force_balance needs experts" -- --moe-force-balance
# --moe-force-balance (benchmarks): every expert equally loaded, every step, and it still learns
"$BIN" --experts 4 --top-k 2 --moe-force-balance --threads 1 --steps 20 --eval-every 0 $EXACT --quiet --log "$T/moefb.jsonl" > "$T/moefb.txt" 2>&1; rc=$?
if [ "$rc" -eq 0 ] && python3 - "$T/moefb.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 20 and all(r["moe_imbalance"] == 1 for r in rows), [r["moe_imbalance"] for r in rows]
assert rows[-1]["loss"] < 0.6 * rows[0]["loss"], (rows[0]["loss"], rows[-1]["loss"])
PY
then ok "--moe-force-balance: imbalance 1 at every step, the loss falls"; else bad "--moe-force-balance (exit $rc) $(tail -3 "$T/moefb.txt")"; fi
# MoE under pipeline parallelism: each stage runs its own layers' routers and experts
reference moepp1 -- --experts 4 --threads 1 --layers 2 --dim 32 --heads 2 --grad-accum 4
same_curve "--experts 4 --pp 2 --dp 2 --ep 2 --pp-schedule zb1 trains to the loss curve of one rank" moepp1 moepp -- --experts 4 --layers 2 --dim 32 --heads 2 --grad-accum 4 --pp 2 --dp 2 --ep 2 --pp-schedule zb1
"$BIN" --experts 4 --top-k 2 --threads 1 --steps 20 --eval-every 0 $EXACT --quiet --log "$T/moe.jsonl" > "$T/moe.txt" 2>&1; rc=$?
if [ "$rc" -eq 0 ] && python3 - "$T/moe.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 20
assert all(k in r for r in rows for k in ("moe_imbalance", "moe_aux_loss", "moe_drop_frac", "moe_load"))
assert all(sum(r["moe_load"]) == 16 * 71 * 2 * 2 for r in rows), "tokens x top-k x MoE layers"
assert all(r["moe_imbalance"] >= 1 for r in rows)
first, last = rows[0]["loss"], sum(r["loss"] for r in rows[-5:]) / 5
print("  MoE loss %.3f -> %.3f" % (first, last))
assert first > 5 and last < 0.6 * first, (first, last)
PY
then ok "--experts 4 --top-k 2 learns the task (loss falls), the log has moe_imbalance, moe_load, ..."; else bad "MoE training run (exit $rc) $(tail -3 "$T/moe.txt")"; fi
"$BIN" --experts 4 --top-k 2 --shared-expert --moe-gate sigmoid --moe-balance aux --moe-aux-coef 0.1 --capacity-factor 1 --moe-groups 2 --moe-top-groups 1 \
      --moe-first-dense 1 --layers 3 --threads 1 --steps 3 --eval-every 0 $EXACT --log "$T/moe2.jsonl" > "$T/moe2.txt" 2>&1; rc=$?
if [ "$rc" -eq 0 ] && grep -q "moe: 2 of 3 layers, E=4 top-2 Fe=64 + shared, sigmoid gates, balance aux | group-limited" "$T/moe2.txt" && python3 - "$T/moe2.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 3 and all(r["moe_aux_loss"] > 0 and 0 <= r["moe_drop_frac"] < 1 for r in rows)
PY
then ok "shared expert, sigmoid gates, aux loss, capacity, group-limited routing, first layer dense: a run and its log"; else bad "MoE options run (exit $rc) $(tail -3 "$T/moe2.txt")"; fi
fi # part mesh

# ==== part flags, continued
if part flags; then
# ---- checkpoints: --save / --save-every / --keep / --resume / --init-from
expect 2 "--save-every without --save is refused" "needs --save" -- $small --save-every 5
expect 2 "--resume and --init-from together are refused" "give one of them" -- $small --resume "$T" --init-from "$T"
expect 2 "--resume of a directory with no checkpoint is refused" "no complete checkpoint" -- $small --resume "$T"
expect 2 "--init-from a directory without config.json is refused" "config.json" -- $small --init-from "$T"
"$BIN" --steps 12 --save "$T/ck" --save-every 4 --keep 2 --threads 1 --eval-every 0 $EXACT --quiet --log "$T/ck_a.jsonl" > "$T/ck_a.txt" 2>&1; rc=$?
if [ "$rc" -eq 0 ] && [ -d "$T/ck/step_00000008" ] && [ -d "$T/ck/step_00000012" ] && [ ! -e "$T/ck/step_00000004" ] && [ -f "$T/ck/step_00000012/model.safetensors" ]; then
    ok "--save DIR --save-every 4 --keep 2 keeps step_8 and step_12"; else bad "--save run (exit $rc): $(ls "$T/ck" 2>&1 | tr '\n' ' ') $(tail -2 "$T/ck_a.txt")"; fi
# resume from step 8 on one rank: steps 9..12 print the same losses (the log's 6 decimals)
"$BIN" --steps 12 --resume "$T/ck/step_00000008" --threads 1 --eval-every 0 $EXACT --quiet --log "$T/ck_b.jsonl" > "$T/ck_b.txt" 2>&1; rc=$?
if [ "$rc" -eq 0 ] && diff <(tail -4 "$T/ck_a.jsonl" | cut -d, -f1,2) <(cut -d, -f1,2 "$T/ck_b.jsonl") > /dev/null; then
    ok "--resume continues with the same losses as the run that did not stop"; else bad "--resume (exit $rc): $(tail -2 "$T/ck_b.txt")"; fi
# --resume DIR picks the newest step_N; under dp 2 x tp 2 the losses agree within 1e-5
# (and a resume with nothing left to train is refused, saying so, before any step)
"$BIN" --steps 12 --resume "$T/ck" --dp 2 --tp 2 --threads 1 --eval-every 0 $EXACT --quiet --log "$T/ck_c.jsonl" > "$T/ck_c.txt" 2>&1; rc=$?
if [ "$rc" -ne 0 ] && [ "$(wc -l < "$T/ck_c.jsonl")" -eq 0 ] &&
   grep -q "step_00000012 is at step 12 and --steps is 12: nothing left to train (give --steps above 12)" "$T/ck_c.txt"; then
    ok "--resume DIR picks the newest checkpoint; --steps 12 at its step 12 is refused"; else bad "--resume newest (exit $rc): $(tail -2 "$T/ck_c.txt")"; fi
expect 1 "--resume with --steps below the checkpoint's step is refused" "step_00000008 is at step 8 and --steps is 5: nothing left to train" \
    -- --steps 5 --resume "$T/ck/step_00000008" --threads 1 --eval-every 0 --quiet
"$BIN" --steps 12 --resume "$T/ck/step_00000008" --dp 2 --tp 2 --threads 1 --eval-every 0 $EXACT --quiet --log "$T/ck_d.jsonl" > "$T/ck_d.txt" 2>&1; rc=$?
if [ "$rc" -eq 0 ] && python3 - "$T/ck_a.jsonl" "$T/ck_d.jsonl" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])][8:]
b = [json.loads(l) for l in open(sys.argv[2])]
assert [r["step"] for r in b] == [9, 10, 11, 12], [r["step"] for r in b]
worst = max(abs(x["loss"] - y["loss"]) / x["loss"] for x, y in zip(a, b))
print("  one-rank checkpoint resumed under dp 2 x tp 2: losses within %.1e relative" % worst)
assert worst < 1e-5, worst
PY
then ok "a one-rank checkpoint resumes under --dp 2 --tp 2 (resharding)"; else bad "resume under dp2 tp2 (exit $rc): $(tail -2 "$T/ck_d.txt")"; fi
expect 0 "--init-from DIR fine-tunes from the weights (step 0, the shape from config.json)" "initialised from .*step_00000012 at step 0" -- --init-from "$T/ck/step_00000012" --steps 2 --threads 1 --eval-every 0
expect 2 "--init-from with a contradicting --dim names both" "hidden_size = 64 but the model config sets 32" -- --init-from "$T/ck/step_00000012" --dim 32 --steps 2
# fp16: the loss scaler's state travels in trainer_state.json. A window of 3 doubles S every 3
# clean steps, so a resume that lost S or its count would log another loss_scale and loss
# (saved at step 4, between the doublings after steps 3 and 6)
"$BIN" --steps 8 --precision fp16 --loss-scale-window 3 --save "$T/ck16" --save-every 4 --threads 1 --eval-every 0 $EXACT --quiet --log "$T/ck16_a.jsonl" > /dev/null 2>&1
"$BIN" --steps 8 --precision fp16 --loss-scale-window 3 --resume "$T/ck16/step_00000004" --threads 1 --eval-every 0 $EXACT --quiet --log "$T/ck16_b.jsonl" > "$T/ck16_b.txt" 2>&1; rc=$?
if [ "$rc" -eq 0 ] && python3 - "$T/ck16_a.jsonl" "$T/ck16_b.jsonl" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])][-4:]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(b) == 4 and [(x["step"], x["loss"], x["loss_scale"]) for x in a] == [(x["step"], x["loss"], x["loss_scale"]) for x in b], (a, b)
assert a[0]["loss_scale"] != 65536, "S never moved: the test would not see a lost scaler state"
PY
then ok "fp16 --resume continues with the same losses and loss scale (the scaler's state is in the checkpoint)"; else bad "fp16 resume (exit $rc): $(tail -2 "$T/ck16_b.txt")"; fi
# ZeRO-2/3 on one rank: nothing to reduce, the gradient slots still empty into the shard (stage 3 used to abort)
for z in 0 2 3; do "$BIN" $small --zero $z --steps 5 --eval-every 0 $EXACT --sample 0 --log "$T/z1r$z.jsonl" > /dev/null 2>&1 || echo "exit $?" > "$T/z1r$z.jsonl"; done
if diff <(cut -d, -f1-4 "$T/z1r0.jsonl") <(cut -d, -f1-4 "$T/z1r2.jsonl") > /dev/null && diff <(cut -d, -f1-4 "$T/z1r0.jsonl") <(cut -d, -f1-4 "$T/z1r3.jsonl") > /dev/null && [ "$(wc -l < "$T/z1r3.jsonl")" -eq 5 ]
then ok "--zero 2 and --zero 3 on one rank train exactly as --zero 0"; else bad "ZeRO on one rank: $(head -c 200 "$T/z1r3.jsonl")"; fi
fi # part flags
echo "test_train_cli${PART:+ ($PART)}: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
