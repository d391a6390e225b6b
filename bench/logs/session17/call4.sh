#!/usr/bin/env bash
# session 17, call 4: s17d = the review's change (the block forward's empty-tile state written by
# us__hop_state_load + us__hop_state_store instead of a second writer, us__hop_state_fresh; the
# deferred dQ's flush-turn tile value-initialised): test_cuda
timeout 120 .dev/s17d/test_cuda > $OUT/test_s17d.txt 2>&1
echo "test_cuda s17d rc=$?: $(tail -1 $OUT/test_s17d.txt)"; grep -E "FAIL" $OUT/test_s17d.txt | head -10
