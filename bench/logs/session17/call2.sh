#!/usr/bin/env bash
# session 17, call 2: s17b = s17a with the dQ kernel's tile GEMM deferred to the next tile's turn
# at HS 64 (us__hop_cfg::DQD, three stages): test_cuda; attn_ab s17b against s17a (us-B) at HS 64
# with ten calls a sample, and kernel by kernel at T 4096; the CP block kernels (their dQ takes
# the same consumer) at T 8192; the 1B step, s17a and s17b interleaved twice
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
T0=$SECONDS; N=.dev/s17b; P=.dev/s17a; cp $P/libus_attn.so /tmp/usb.so
timeout 120 $N/test_cuda > $OUT/test_s17b.txt 2>&1
echo "test_cuda s17b rc=$? $((SECONDS-T0)) s: $(tail -1 $OUT/test_s17b.txt)" > $OUT/summary.txt
grep -E "FAIL" $OUT/test_s17b.txt | head -10 >> $OUT/summary.txt
timeout 150 python3 bench/attn_ab.py --lib $N/libus_attn.so --lib-b /tmp/usb.so --att-heads 32:8:64,32:32:64 --att-seq 2048,4096,8192 --reps 20 --batch 10 > $OUT/ab.txt 2>&1
echo "attn_ab rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
timeout 60 python3 bench/attn_ab.py --lib $N/libus_attn.so --lib-b /tmp/usb.so --att-heads 32:8:64 --att-seq 4096 --reps 5 --kernels > $OUT/ab_kernels.txt 2>&1
echo "attn_ab --kernels rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
for v in s17a s17b; do
  timeout 60 .dev/$v/bench_cuda --cp-flash-only --cp-seq 8192 > $OUT/cp_$v.txt 2>&1
  echo "cp $v rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
done
for i in 1 2; do for v in s17a s17b; do
  timeout 60 .dev/$v/bench_cuda --preset 1b --steps 6 --warmup 2 > $OUT/b1b_${v}_$i.txt 2>&1
  echo "1b $v #$i rc=$? $((SECONDS-T0)) s: $(grep -E '^ultrascale ' $OUT/b1b_${v}_$i.txt | cut -c1-110)" >> $OUT/summary.txt
done; done
sed -n '/one process/,$p' $OUT/ab.txt | cut -c1-130 >> $OUT/summary.txt
grep -E "kernel .*(dq|dkdv|dot)" $OUT/ab_kernels.txt | cut -c1-110 >> $OUT/summary.txt
for v in s17a s17b; do echo "== cp $v" >> $OUT/summary.txt; grep -E "^\| (causal|one block, positions.*hopper|cp=2 zig-zag, hopper|cp=4 zig-zag, hopper)" $OUT/cp_$v.txt | cut -c1-150 >> $OUT/summary.txt; done
echo "total $((SECONDS-T0)) s" >> $OUT/summary.txt
cat $OUT/summary.txt
