#!/usr/bin/env bash
# session 23, call 1: s23a = main at e8350aa (the session's start). Where the FP8 step's 2-D
# quantisers spend their time: Nsight Compute (full set) on us__k_fp8_row_t, transposed only and
# both ways, at 16384 x 2048 (bench_cuda --fp8-gemm's third shape), and on SwiGLU's FP8 backward;
# the quantisers' GB/s table; the 8b8 step's profile, fp8 and bf16.
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
tar xzf .dev/c1.tgz
T0=$SECONDS; N=.dev/s23a; S=$OUT/summary.txt
timeout 100 $N/bench_cuda --fp8-gemm > $OUT/fp8gemm.txt 2>&1
echo "fp8-gemm rc=$? $((SECONDS-T0)) s" > $S
grep -E "^\|" $OUT/fp8gemm.txt >> $S
timeout 60 $N/bench_cuda --swiglu-bwd-fp8 2>&1 | grep swiglu >> $S
# shape 2 (16384 x 2048 x 2048): row_t launches 60..74 transposed only (v 5), 75..89 both (v 7)
timeout 150 ncu --set full -k regex:us__k_fp8_row_t --launch-skip 74 --launch-count 2 $N/bench_cuda --fp8-gemm > $OUT/ncu_rowt.txt 2>&1
echo "ncu rowt rc=$? $((SECONDS-T0)) s" >> $S
timeout 100 ncu --set full -k regex:us__k_swiglu_bwd_fp8 --launch-skip 3 --launch-count 1 $N/bench_cuda --swiglu-bwd-fp8 > $OUT/ncu_swb.txt 2>&1
echo "ncu swiglu bwd rc=$? $((SECONDS-T0)) s" >> $S
for p in fp8 bf16; do
  timeout 100 $N/bench_cuda --preset 8b8 --steps 3 --warmup 2 --precision $p --profile > $OUT/prof8b8_$p.txt 2>&1
  echo "== 8b8 $p profile rc=$? $((SECONDS-T0)) s" >> $S
done
for f in ncu_rowt ncu_swb; do echo "== $f" >> $S; grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Memory Throughput|Issue Slots Busy|No Eligible|Eligible Warps|Executed Ipc A|Achieved Occupancy|Registers Per|Theoretical Occ|Block Limit|L1/TEX Hit|L2 Hit|Compute \(SM\) Th|Bank" $OUT/$f.txt | cut -c1-140 >> $S; done
echo "total $((SECONDS-T0)) s" >> $S
cat $S
