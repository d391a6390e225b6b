#!/usr/bin/env bash
# Runs the steps tests/steps.sh lists (step NAME "NEEDS" 'COMMAND') and sums their results.
#   bash tests/run_all.sh STEPS            run every step, one after the other, then the summary
#                                          (the programs must be built: make test-builds)
#   bash tests/run_all.sh --makefile STEPS print make rules, one phony target step-N per step
#                                          that needs NEEDS and runs the step (make test uses them)
#   bash tests/run_all.sh --step N STEPS   run step N: its output and exit status go to $B/steps/,
#                                          one line (ok / FAIL / skip) to stdout
#   bash tests/run_all.sh --report STEPS   the failures again, then the total
# A step's "N passed, N failed[, N skipped]" line is summed; a step that prints none counts as
# one pass or one failure by its exit code, one that prints a line starting SKIP as one skip. The
# last line is the total, "N passed, N failed, N skipped"; the exit status is non-zero on any
# failure. $B is the build directory (default build).
set -u
B=${B:-build}; NVCC=${NVCC:-}; NCCL=${NCCL:-}; GPU=${GPU:-}
export B NVCC NCCL GPU
mode=all; n_arg=
case ${1:-} in
    --makefile | --report) mode=${1#--}; shift ;;
    --step) mode=step; n_arg=$2; shift 2 ;;
esac
[ $# -eq 1 ] || { echo "usage: run_all.sh [--makefile | --step N | --report] tests/steps.sh" >&2; exit 2; }
names=(); needs=(); cmds=()
step() { names+=("$1"); needs+=("$2"); cmds+=("$3"); }
. "$1" || { echo "run_all.sh: cannot read $1" >&2; exit 2; }
n=${#names[@]}
dir=$B/steps

if [ "$mode" = makefile ]; then
    printf 'TEST_STEPS =' ; for ((i = 0; i < n; i++)); do printf ' step-%d' "$i"; done; printf '\n'
    printf '.PHONY: test-steps $(TEST_STEPS)\ntest-steps: $(TEST_STEPS)\n'
    for ((i = 0; i < n; i++)); do
        printf 'step-%d: %s\n\t@B=%s NVCC=%s NCCL=%s GPU=%s bash %s --step %d %s\n' \
            "$i" "${needs[$i]}" "$B" "$NVCC" "$NCCL" "$GPU" "$0" "$i" "$1"
    done
    exit 0
fi

# result I: sets p f s line rc secs out from the step's files (missing: not run, one failure)
result() {
    out=''; rc=''; secs='-'; line=''
    if [ ! -f "$dir/$1.rc" ]; then p=0; f=1; s=0; return; fi
    out=$(cat "$dir/$1.out"); read -r rc secs < "$dir/$1.rc"
    line=$(printf '%s\n' "$out" | grep -E '[0-9]+ passed, [0-9]+ failed' | tail -n 1)
    if [ -n "$line" ]; then
        p=$(sed -E 's/.* ([0-9]+) passed.*/\1/' <<<"$line"); f=$(sed -E 's/.* ([0-9]+) failed.*/\1/' <<<"$line")
        s=0; if grep -q skipped <<<"$line"; then s=$(sed -E 's/.* ([0-9]+) skipped.*/\1/' <<<"$line"); fi
        if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    elif grep -q '^SKIP' <<<"$out"; then p=0; f=0; s=1
    elif [ "$rc" -eq 0 ]; then p=1; f=0; s=0
    else p=0; f=1; s=0
    fi
}

# show I [details]: the step's one line; with details, a failure's error lines under it
show() {
    local name=${names[$1]}
    if [ "$f" -gt 0 ]; then
        if [ -z "$rc" ]; then printf 'FAIL %-34s not run: a program it needs did not build (%s)\n' "$name" "${needs[$1]}"; return; fi
        printf 'FAIL %-34s %4ss  %s\n' "$name" "$secs" "${line:-exit $rc}"
        [ -n "${2:-}" ] && printf '%s\n' "$out" | grep -E 'FAIL|error|Error|ERROR|runtime error|No such file' | head -n 20 | sed 's/^/     /'
    elif [ "$s" -gt 0 ] && [ "$p" -eq 0 ]; then
        printf 'skip %-34s %4ss  %s\n' "$name" "$secs" "$(printf '%s\n' "$out" | grep '^SKIP' | head -n 1)"
    else
        printf 'ok   %-34s %4ss  %s\n' "$name" "$secs" "$line"
    fi
}

run() {   # run I: the step's output into $dir/I.out, "EXIT-STATUS SECONDS" into I.rc
    local t0=$SECONDS st
    mkdir -p "$dir"
    # OpenMP threads that sleep rather than spin while they wait: several steps share the cores
    ( export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}; eval "${cmds[$1]}" ) > "$dir/$1.out" 2>&1 < /dev/null
    st=$?
    echo "$st $((SECONDS - t0))" > "$dir/$1.rc"
}

report() {
    local i pass=0 fail=0 skip=0 failed=()
    for ((i = 0; i < n; i++)); do
        result "$i"
        pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
        [ "$f" -gt 0 ] && failed+=("$i")
    done
    for i in "${failed[@]+"${failed[@]}"}"; do result "$i"; show "$i" details; done
    echo "$pass passed, $fail failed, $skip skipped"
    [ "$fail" -eq 0 ]
}

case $mode in
    step) run "$n_arg"; result "$n_arg"; show "$n_arg"; exit 0 ;;   # 0 whatever the step did: make goes on
    report) report ;;
    all)
        rm -rf "$dir"
        for ((i = 0; i < n; i++)); do run "$i"; result "$i"; show "$i"; done
        report ;;
esac
