#!/usr/bin/env bash
# The committed figures in docs/ equal what the programs that draw them write now:
#   bash tests/figures_check.sh B            build/figures' four SVGs and build/schedule's six
#                                            pipeline timelines (make test)
#   bash tests/figures_check.sh B --heatmap  also the planner's heatmap, build/plan --sweep
#                                            (about 95 s of CPU: make figures-check)
# A figure that differs is named with the command that redraws it into docs/.
set -u
B=${1:-build}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0; fail=0
same() {   # same FILE COMMAND: docs/FILE equals $T/FILE, which COMMAND wrote
    if cmp -s "docs/$1" "$T/$1"; then pass=$((pass + 1)); echo "  ok   docs/$1"
    else fail=$((fail + 1)); echo "  FAIL docs/$1 differs from what \`${2//\$T/docs}\` writes"; fi
}
"$B/figures" "$T" > /dev/null || { echo "  FAIL build/figures"; fail=$((fail + 1)); }
for f in fig_memory_recompute fig_zero_ladder fig_pp_bubble fig_tp_tradeoff; do
    same "$f.svg" "$B/figures \$T"
done
for k in 1f1b interleaved zb1 zbv dualpipev dualpipe; do
    args="--schedule $k --pp 4 --m 8"
    [ "$k" = interleaved ] && args="$args --v 2"
    # DualPipe as DeepSeek-V3 draws it (Figure 5): 8 ranks, 20 micro-batches in two directions
    [ "$k" = dualpipe ] && args="--schedule $k --pp 8 --m 20"
    "$B/schedule" $args --svg "$T/pp_$k.svg" > /dev/null
    same "pp_$k.svg" "$B/schedule $args --svg \$T/pp_$k.svg"
done
if [ "${2:-}" = --heatmap ]; then
    "$B/plan" --sweep --svg "$T/plan_heatmap.svg" > /dev/null
    same plan_heatmap.svg "$B/plan --sweep --svg \$T/plan_heatmap.svg"
fi
echo "figures_check: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
