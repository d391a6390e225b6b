#!/usr/bin/env bash
# session 18, call 1: s18a = the dK/dV kernel at HS 64 with tiles of 64 queries, K and V whole as
# register fragments and its tile GEMMs deferred a tile (us__hop_cfg::DKD, three stages);
# s18v1 = the same without the deferral (libus_attn.so only); base = s17c (e2ee951).
# test_cuda s18a; attn_ab s18a and s18v1 against s17c; kernels at T 4096; the CP block kernels
# at T 8192 (--cp-seq); the 1B step, s17c and s18a interleaved twice
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
tar xzf .dev/c1.tgz
T0=$SECONDS; N=.dev/s18a; P=.dev/s17c; cp $P/libus_attn.so /tmp/usb.so; cp .dev/s18v1/libus_attn.so /tmp/usv1.so
timeout 120 $N/test_cuda > $OUT/test_s18a.txt 2>&1
echo "test_cuda s18a rc=$? $((SECONDS-T0)) s: $(tail -1 $OUT/test_s18a.txt)" > $OUT/summary.txt
grep -E "FAIL" $OUT/test_s18a.txt | head -10 >> $OUT/summary.txt
timeout 150 python3 bench/attn_ab.py --lib $N/libus_attn.so --lib-b /tmp/usb.so --att-heads 32:8:64,32:32:64 --att-seq 2048,4096,8192 --reps 20 --batch 10 > $OUT/ab.txt 2>&1
echo "attn_ab s18a/s17c rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
timeout 100 python3 bench/attn_ab.py --lib /tmp/usv1.so --lib-b /tmp/usb.so --att-heads 32:8:64 --att-seq 4096,8192 --reps 20 --batch 10 > $OUT/ab_v1.txt 2>&1
echo "attn_ab s18v1/s17c rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
timeout 60 python3 bench/attn_ab.py --lib $N/libus_attn.so --lib-b /tmp/usb.so --att-heads 32:8:64 --att-seq 4096 --reps 5 --kernels > $OUT/ab_kernels.txt 2>&1
echo "attn_ab --kernels rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
for v in s17c s18a; do
  timeout 60 .dev/$v/bench_cuda --cp-seq 8192 > $OUT/cp_$v.txt 2>&1
  echo "cp $v rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
done
for i in 1 2; do for v in s17c s18a; do
  timeout 60 .dev/$v/bench_cuda --preset 1b --steps 6 --warmup 2 > $OUT/b1b_${v}_$i.txt 2>&1
  echo "1b $v #$i rc=$? $((SECONDS-T0)) s: $(grep -E '^ultrascale ' $OUT/b1b_${v}_$i.txt | cut -c1-110)" >> $OUT/summary.txt
done; done
sed -n '/one process/,$p' $OUT/ab.txt | cut -c1-130 >> $OUT/summary.txt
sed -n '/one process/,$p' $OUT/ab_v1.txt | cut -c1-130 >> $OUT/summary.txt
grep -E "kernel .*(dq|dkdv|dot)" $OUT/ab_kernels.txt | cut -c1-110 >> $OUT/summary.txt
for v in s17c s18a; do echo "== cp $v" >> $OUT/summary.txt; grep -E "^\| (causal|one block, positions.*hopper|cp=2 zig-zag, hopper|cp=4 zig-zag, hopper)" $OUT/cp_$v.txt | cut -c1-150 >> $OUT/summary.txt; done
echo "total $((SECONDS-T0)) s" >> $OUT/summary.txt
cd $OUT && tar czf logs.tgz *.txt && cd - > /dev/null
cat $OUT/summary.txt
