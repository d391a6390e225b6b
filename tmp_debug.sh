#!/usr/bin/env bash
# temporary: where does rank 0 stall after its peer dies? and why does AFAB fail on NCCL?
export NCCL_NVLS_ENABLE=0
which gdb eu-stack pstack 2>&1 | head -3
M="--data build/tinyshakespeare.txt --layers 6 --dim 512 --heads 8 --seq 256 --steps 5 --eval-every 0 --quiet --bucket-mb 4 --lr 1e-3"
timeout 100 build/train_cuda $M --batch 4 --grad-accum 4 --nproc 2 --pp 2 --pp-schedule afab > $OUT/afab.txt 2>&1; echo "afab exit $?"; tail -5 $OUT/afab.txt
E="MASTER_ADDR=127.0.0.1 MASTER_PORT=29563 WORLD_SIZE=2"
env $E RANK=0 LOCAL_RANK=0 build/train_cuda --dp 2 --steps 1000000 --eval-every 0 --quiet --comm-timeout 10 > $OUT/fault_r0.txt 2>&1 &
p0=$!
env $E RANK=1 LOCAL_RANK=1 build/train_cuda --dp 2 --steps 1000000 --eval-every 0 --quiet --comm-timeout 10 > $OUT/fault_r1.txt 2>&1 &
p1=$!
sleep 10; kill -9 $p1; tk=$(date +%s)
sleep 13
if kill -0 $p0 2>/dev/null; then
  echo "rank 0 alive at kill+13s"
  if which gdb >/dev/null 2>&1; then timeout 60 gdb -batch -p $p0 -ex "thread apply all bt 12" > $OUT/bt.txt 2>&1; grep -E "^#|^Thread" $OUT/bt.txt | grep -v "in ?? ()" | head -80
  else for t in /proc/$p0/task/*; do echo "$t $(cat $t/comm) $(cat $t/wchan) $(cut -d' ' -f1 $t/syscall)"; done; fi
fi
wait $p0; echo "rank 0 exit $? after $(( $(date +%s) - tk )) s"; cat $OUT/fault_r0.txt | tail -5
