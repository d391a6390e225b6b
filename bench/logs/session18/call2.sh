#!/usr/bin/env bash
# session 18, call 2: s18b = the dK/dV consumer at HS 64 issues Sᵀ and dPᵀ in two parts of 64
# queries (two commit groups, us__hop_cfg::SPL) and forms the first part's Pᵀ and dSᵀ while the
# second part's GEMMs run; base = s17c (e2ee951). test_cuda s18b; attn_ab s18b against s17c at
# HS 64 (ten calls a sample) and kernel by kernel at T 4096; the CP block kernels at T 8192;
# the 1B step, s17c and s18b interleaved twice; the 1B fp8 step profiled (s18b)
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
tar xzf .dev/c2.tgz
T0=$SECONDS; N=.dev/s18b; P=.dev/s17c; cp $P/libus_attn.so /tmp/usb.so
timeout 120 $N/test_cuda > $OUT/test_s18b.txt 2>&1
echo "test_cuda s18b rc=$? $((SECONDS-T0)) s: $(tail -1 $OUT/test_s18b.txt)" > $OUT/summary.txt
grep -E "FAIL" $OUT/test_s18b.txt | head -10 >> $OUT/summary.txt
timeout 150 python3 bench/attn_ab.py --lib $N/libus_attn.so --lib-b /tmp/usb.so --att-heads 32:8:64,32:32:64 --att-seq 2048,4096,8192 --reps 20 --batch 10 > $OUT/ab.txt 2>&1
echo "attn_ab s18b/s17c rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
timeout 60 python3 bench/attn_ab.py --lib $N/libus_attn.so --lib-b /tmp/usb.so --att-heads 32:8:64 --att-seq 4096 --reps 5 --kernels > $OUT/ab_kernels.txt 2>&1
echo "attn_ab --kernels rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
for v in s17c s18b; do
  timeout 60 .dev/$v/bench_cuda --cp-seq 8192 > $OUT/cp_$v.txt 2>&1
  echo "cp $v rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
done
for i in 1 2; do for v in s17c s18b; do
  timeout 60 .dev/$v/bench_cuda --preset 1b --steps 6 --warmup 2 > $OUT/b1b_${v}_$i.txt 2>&1
  echo "1b $v #$i rc=$? $((SECONDS-T0)) s: $(grep -E '^ultrascale ' $OUT/b1b_${v}_$i.txt | cut -c1-110)" >> $OUT/summary.txt
done; done
timeout 60 $N/bench_cuda --preset 1b --precision fp8 --steps 3 --warmup 2 --profile > $OUT/fp8_1b_profile.txt 2>&1
echo "1b fp8 profile rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
sed -n '/one process/,$p' $OUT/ab.txt | cut -c1-130 >> $OUT/summary.txt
grep -E "kernel .*(dq|dkdv|dot)" $OUT/ab_kernels.txt | cut -c1-110 >> $OUT/summary.txt
for v in s17c s18b; do echo "== cp $v" >> $OUT/summary.txt; grep -E "^\| (causal|one block, positions.*hopper|cp=2 zig-zag, hopper|cp=4 zig-zag, hopper)" $OUT/cp_$v.txt | cut -c1-150 >> $OUT/summary.txt; done
echo "total $((SECONDS-T0)) s" >> $OUT/summary.txt
cd $OUT && tar czf logs.tgz test_s18b.txt cp_s18b.txt summary.txt && rm -f test_s18b.txt && cd - > /dev/null
cat $OUT/summary.txt
