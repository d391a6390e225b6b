#!/bin/bash
# h64 call 2: interleaved bench; old (main) vs A (new) vs C (fused also at HS 80/96, two-kernel at 40/232)
set -o pipefail
export NCCL_NVLS_ENABLE=0
D=/tmp/h64dev
mkdir -p /tmp/old /tmp/c
tar --exclude=./.dev --exclude=./build -cf - . | (cd /tmp/old && tar xf -)
cp $D/bench/bench_cuda.cu /tmp/old/bench/
cp -r $D/ultrascale_cuda.cuh $D/tests $D/bench .
tar --exclude=./.dev --exclude=./build -cf - . | (cd /tmp/c && tar xf -)
cp $D/varC.cuh /tmp/c/ultrascale_cuda.cuh
(cd /tmp/old && make -j5 build/bench_cuda > $OUT/build_old.txt 2>&1; echo "rc $?" >> $OUT/build_old.txt) &
P1=$!
(cd /tmp/c && make -j5 build/bench_cuda > $OUT/build_c.txt 2>&1; echo "rc $?" >> $OUT/build_c.txt) &
P2=$!
make -j6 build/test_cuda build/bench_cuda > $OUT/build_a.txt 2>&1 || { tail -30 $OUT/build_a.txt; }
wait $P1 $P2; echo "built at $SECONDS s"; tail -1 $OUT/build_old.txt $OUT/build_c.txt
SH=32:8:64,20:4:80,16:4:96,16:4:128,16:16:128
A="--attention --att-seq 2048,4096,8192 --att-heads $SH"
stdbuf -oL build/bench_cuda $A > $OUT/bench_a.txt 2>&1
stdbuf -oL /tmp/c/build/bench_cuda $A > $OUT/bench_c.txt 2>&1
stdbuf -oL /tmp/old/build/bench_cuda $A > $OUT/bench_old.txt 2>&1
echo "benched at $SECONDS s"
python3 $D/summary2.py $OUT | tee $OUT/summary.txt
if [ $SECONDS -lt 200 ]; then
  stdbuf -oL timeout $((232 - SECONDS)) build/test_cuda --attention > $OUT/test_att.txt 2>&1; echo "test rc $? at $SECONDS s"
  tail -2 $OUT/test_att.txt
fi
