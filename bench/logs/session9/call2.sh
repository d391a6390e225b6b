#!/usr/bin/env bash
# session 9, call 2: persistent vs one CTA per tile (same binary), kernel durations (ncu) of ours and
# cuDNN's at the 1B shape T 4096 and HS 128 GQA T 4096, the 1B step against torch.compile
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
N=.dev/s9b; O=.dev/c6; T0=$SECONDS
timeout 60 stdbuf -oL $N/test_cuda --attention > $OUT/test_att.txt 2>&1; echo "test_cuda --attention rc=$? $((SECONDS-T0)) s"; grep -E "FAIL" $OUT/test_att.txt | head -5; tail -1 $OUT/test_att.txt
timeout 150 stdbuf -oL $N/bench_cuda --attention --att-heads 32:8:64,16:4:128,16:16:128 > $OUT/att_new.txt 2>&1; echo "bench done $((SECONDS-T0)) s"
for sh in "32 8 64" "16 4 128"; do
  set -- $sh
  timeout 60 ncu --metrics gpu__time_duration.sum -k regex:us__hop --launch-skip 4 --launch-count 8 $N/bench_cuda --attention --att-seq 4096 --att-heads $1:$2:$3 > $OUT/ncu_us_$3.txt 2>&1
  timeout 60 ncu --metrics gpu__time_duration.sum --launch-skip 0 --launch-count 40 python3 bench/logs/session9/cudnn_one.py $1 $2 $3 4096 > $OUT/ncu_cudnn_$3.txt 2>&1
done
echo "ncu done $((SECONDS-T0)) s"
S="--preset 1b --steps 6 --warmup 2"
run() { timeout 90 stdbuf -oL $1/bench_cuda $S > $OUT/$2.txt 2>&1; echo "$2: $(grep -hE '^ultrascale' $OUT/$2.txt | cut -c1-112) ($((SECONDS-T0)) s)"; }
run $N new1; run $O old1
timeout 200 python3 bench/torch_llama.py --preset 1b --steps 6 --warmup-steps 2 --compile > $OUT/compile.txt 2>&1; echo "compile: $(grep -hE '^torch' $OUT/compile.txt | cut -c1-130) ($((SECONDS-T0)) s)"
run $N new2; run $O old2
echo "total $((SECONDS-T0)) s"
grep -E "^us-hop" $OUT/att_new.txt
for f in $OUT/ncu_us_*.txt $OUT/ncu_cudnn_*.txt; do echo "== $f"; grep -E "^  [a-zA-Z_].*\(|gpu__time_duration" $f | paste - - | sed -E 's/\s+/ /g' | cut -c1-150 | head -40; done
