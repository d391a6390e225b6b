# tests/steps.sh — every step of `make test`. Sourced by tests/run_all.sh; each line is
#     step NAME "NEEDS" 'COMMAND'
# NEEDS: the make targets the step needs (make builds them first and runs steps as soon as what
# they need is built, one job more than cores); COMMAND: a bash command line run from the repository
# root. $B is the build directory; $NVCC and $NCCL are 1 where nvcc / nccl.h are installed, $GPU
# where a GPU is (a /dev/nvidia device, or nvidia-smi lists one); each is empty elsewhere. A step
# passes on exit 0 or by its last "N passed, N failed" line; a step that prints a line starting
# with SKIP is a skip. Make takes the steps in this order, so the areas that run longest come
# first (the trainer's CLI, the parallel layouts, the sanitizer runs), and within an area the
# longest steps; the compile checks, many short builds, come last and fill the cores at the end.

# OpenMP's waiting threads sleep instead of spinning (unless the caller chose): make test keeps
# every core busy, and a spinning thread takes its core from another job (test_fp8_train beside a
# compile: 32 s of CPU with the default, 9 s with passive; a short spin, GOMP_SPINCOUNT=10000,
# made the whole of make test 8 % slower; the trainer sets its own when the caller did not)
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

# a program nvcc built (needs: nvcc_needs NAME)
nvcc_needs() { [ -n "$NVCC" ] && echo "$B/$1"; }
# a program nvcc builds only where a GPU is present (needs: gpu_needs NAME)
gpu_needs() { [ -n "$NVCC" ] && [ -n "$GPU" ] && echo "$B/$1"; }
nvcc_built() { if [ -n "$NVCC" ]; then test -f "$B/$1"; else echo 'SKIP nvcc not installed'; fi; }
# a GPU test: SKIP where no GPU is or nvcc did not build it (the program also says SKIP without one)
# (without a GPU it is not started: loading cuBLASLt and NCCL from a cold disk took 12 s)
gpu_run() {
    if [ -z "$GPU" ]; then echo 'SKIP no GPU'
    elif [ -x "$B/$1" ]; then "./$B/$1"
    else echo 'SKIP not built'
    fi
}

# ---- the layout: clang-format 14 would change nothing (make format)
step 'sources formatted (.clang-format)'  ''                  'bash tests/format_check.sh'
# ---- no function over 120 lines in the headers and the trainer (tests/func_lengths.py)
step 'no function over 120 lines'         '' \
     'for f in ultrascale.h ultrascale_comm.h ultrascale_cuda.cuh examples/train.c; do
          r=$(python3 tests/func_lengths.py $f | tail -n 1)
          grep -q " 0 over 120 lines" <<<"$r" || { echo "$f: $r"; exit 1; }
      done'

# ---- the command-line tools and examples
# (the trainer's test in three parts, side by side: tests/test_train_cli.sh)
step 'train CLI: dp, tp, cp, pp'         "$B/train"          'bash tests/test_train_cli.sh $B/train parallel'
step 'train CLI: flags, data, checkpoints' "$B/train"        'bash tests/test_train_cli.sh $B/train flags'
step 'train CLI: 4D mesh, MoE, ep'       "$B/train"          'bash tests/test_train_cli.sh $B/train mesh'
step 'quick start runs'                  "$B/quickstart"     './$B/quickstart | grep -q "step 300 loss"'
step 'dp quick start runs (4 threads, ZeRO-2)' \
                                         "$B/dp_quickstart"  './$B/dp_quickstart | grep -q "step 100 loss"'
step 'plan CLI'                          "$B/plan $B/train"  'bash tests/test_plan_cli.sh $B/plan $B/train'
step 'tokenize CLI, train --tokenizer'   "$B/tokenize $B/train" 'bash tests/test_tokenize_cli.sh $B'
step 'generate CLI: cached text equals re-run' "$B/generate $B/train" 'bash tests/test_generate_cli.sh $B'
step 'memory CLI'                        "$B/memory"         'bash tests/test_memory_cli.sh $B/memory'
step 'bench/power.py and the power table' ''                 'bash tests/test_power.sh'
step 'cp_memory prints the table'        "$B/cp_memory"      './$B/cp_memory | grep -q "^  131072"'
step 'schedule CLI: table and SVG'       "$B/schedule" \
     './$B/schedule | grep -q dualpipev &&
      ./$B/schedule --schedule interleaved --svg $B/il.svg | grep -q wrote && grep -q "<svg" $B/il.svg &&
      ./$B/schedule --schedule dualpipev --svg $B/dpv.svg | grep -q wrote && grep -q "stroke=\"black\"" $B/dpv.svg &&
      ! ./$B/schedule --pp 0 2>/dev/null && ! ./$B/schedule --schedule dualpipev --m 6 2>/dev/null &&
      ./$B/schedule | grep -q "| dualpipe " &&
      ./$B/schedule --schedule dualpipe --svg $B/dp.svg | grep -q wrote && grep -q "stroke=\"black\"" $B/dp.svg &&
      ! ./$B/schedule --schedule dualpipe --pp 3 2>/dev/null && ! ./$B/schedule --schedule dualpipe --m 7 2>/dev/null'
step 'figures writes the four SVGs'      "$B/figures" \
     './$B/figures $B | grep -c "svg:" | grep -qx 4 && grep -q "</svg>" $B/fig_tp_tradeoff.svg'
step 'docs/ figures equal what figures and schedule draw' "$B/figures $B/schedule" \
                                                           'bash tests/figures_check.sh $B'
step "README's C example (examples/readme_snippet.c): C, C++, same text" \
                                         "$B/readme_snippet $B/readme_snippet_cxx" \
                                                           'bash tests/readme_snippet.sh'
step 'hf_logits builds (bench/hf_logits.sh runs it)' "$B/hf_logits" 'test -x $B/hf_logits'
step 'calibrate_cpu writes a rates file plan reads' "$B/calibrate_cpu $B/plan" \
     './$B/calibrate_cpu --quick --out $B/rates_cpu.txt | grep -q wrote &&
      ./$B/plan --rates $B/rates_cpu.txt --model llama-1b --top 1 | grep -q "^top"'

# ---- parallelism over the threads backend: every configuration against the single rank
step 'test_pp'                           "$B/test_pp"             './$B/test_pp'
step 'test_tp'                           "$B/test_internal"       './$B/test_internal tp'
step 'test_comm_threads'                 "$B/test_comm_threads"   './$B/test_comm_threads'
step 'test_dp'                           "$B/test_internal"       './$B/test_internal dp'
step 'test_cp'                           "$B/test_cp"             './$B/test_cp'
step 'test_plan'                         "$B/test_plan"           './$B/test_plan'
step 'test_comm'                         "$B/test_comm"           './$B/test_comm'
step 'test_bootstrap'                    "$B/test_bootstrap"      './$B/test_bootstrap'
step 'test_cp_ops'                       "$B/test_cp_ops"         './$B/test_cp_ops'
step 'test_pp_sched'                     "$B/test_pp_sched"       './$B/test_pp_sched'

# the program that runs tests/test_NAME.c: test_NAME, or for the four that use the implementation's
# private parts, `test_internal NAME` (one program: the implementation compiled once for them)
prog() { case $1 in dp | tp | fp8_train | moe) echo "test_internal $1" ;; *) echo "test_$1" ;; esac; }

# ---- the same tests under AddressSanitizer + UndefinedBehaviorSanitizer (the slow ones --quick)
for t in pp tp ep ckpt fp16 dp gemm cp fp8_train moe plan ops fp8 comm_threads model errors comm \
         cp_ops pp_sched bootstrap dtypes tok data; do
    case $t in tp | pp | dp | cp | ep | fp16 | fp8_train | model | plan) quick=' --quick' ;; *) quick='' ;; esac
    p=$(prog $t)
    step "asan+ubsan test_$t"            "$B/san/${p%% *}"        "./\$B/san/$p$quick"
done

# ---- one device: numbers, kernels, the model
step 'test_fp8_train'                    "$B/test_internal"       './$B/test_internal fp8_train'
step 'test_gemm'                         "$B/test_gemm"           './$B/test_gemm'
step 'test_gemm (portable, no AVX2)'     "$B/test_gemm_portable"  './$B/test_gemm_portable'
step 'test_ops'                          "$B/test_ops"            './$B/test_ops'
step 'test_fp8'                          "$B/test_fp8"            './$B/test_fp8'
step 'test_fp16'                         "$B/test_fp16"           './$B/test_fp16'
step 'test_model'                        "$B/test_model"          './$B/test_model'
step 'test_moe'                          "$B/test_internal"       './$B/test_internal moe'
step 'test_ep'                           "$B/test_ep"             './$B/test_ep'
step 'test_dtypes'                       "$B/test_dtypes"         './$B/test_dtypes'
step 'test_errors'                       "$B/test_errors"         './$B/test_errors'

# ---- the tokenizer: tokenizer.json byte-level BPE against Hugging Face tokenizers' ids (tests/tok)
step 'test_tok'                          "$B/test_tok"            './$B/test_tok'

# ---- data: the shard loader (every window once per epoch, dp ranks, resume, bad shards)
step 'test_data'                         "$B/test_data"           './$B/test_data'

# ---- checkpoints
step 'test_ckpt'                         "$B/test_ckpt"           './$B/test_ckpt'
step "test_ckpt_py (files from Python's safetensors)" \
                                         "$B/test_ckpt $B/train"  'bash tests/test_ckpt_py.sh $B/test_ckpt'
step 'test_hf (Hugging Face Llamas: RoPE, logits, loss, gradients against transformers)' \
                                         "$B/test_ckpt"           'bash tests/test_hf.sh $B/test_ckpt'
step 'fuzz corpus replay (asan+ubsan)'   "$B/fuzz_replay"         './$B/fuzz_replay tests/fuzz_corpus/*'

# ---- compile checks: no warning at -O2 (C99 pedantic), C++, two translation units,
# ULTRASCALE_STATIC, each opt-out (ULTRASCALE_NO_*: what remains compiles without a warning and
# trains a step), no OpenMP, and nvcc (the CUDA compiler sees the header as C++) where it is
# installed (without a GPU nvcc builds PTX, not SASS: the Makefile's NVCHECK); a check
# passes when make built its target (the Makefile's rules hold the compiler command lines)
# (the implementation's own compile with CFLAGS, C99 -pedantic at -O2: the Makefile keeps its messages)
step 'the implementation compiles without a warning' "$B/ultrascale.o" \
     'if [ -s $B/ultrascale.warnings ]; then cat $B/ultrascale.warnings; exit 1; fi'
step 'c++ -Werror'                       "$B/cc_cxx"              'test -x $B/cc_cxx'
step 'two translation units'             "$B/cc_2tu"              './$B/cc_2tu'
step 'ULTRASCALE_STATIC'                 "$B/cc_static"           'test -x $B/cc_static'
for o in CHECKPOINT PLANNER DATA TOKENIZER; do
    step "ULTRASCALE_NO_$o (an opt-out)" "$B/cc_no_$o"      "./\$B/cc_no_$o"
done
# clang's front end (its warnings are the parser's and Sema's), as C99 and as C++, where installed
step 'clang -Werror: C99 and C++'        '' \
     'if command -v clang > /dev/null; then
          clang -std=c99 -Wall -Wextra -pedantic -Werror -D_POSIX_C_SOURCE=200809L -DUS_COMPILE_SINGLE -fsyntax-only tests/compile_a.c &&
          clang -x c++ -std=c++11 -Wall -Wextra -Werror -DUS_COMPILE_SINGLE -fsyntax-only tests/compile_a.c
      else echo "SKIP clang not installed"; fi'
step 'without OpenMP'                    "$B/cc_2tu"              '! nm $B/cc_2tu | grep -q GOMP_'
step 'nvcc (header as C++)'              "$(nvcc_needs cc_nvcc.o)"       'nvcc_built cc_nvcc.o'
step 'nvcc: trainer with CUDA backend'   "$(nvcc_needs train_cuda)"      'nvcc_built train_cuda'
step 'nvcc: test_cuda'                   "$(nvcc_needs test_cuda)"       'nvcc_built test_cuda'
step 'Hopper attention tile order (band_emu)' "$(nvcc_needs band_emu)" \
    'if [ -n "$NVCC" ]; then ./$B/band_emu; else echo "SKIP nvcc not installed"; fi'
step 'nvcc: gemm_steps'                  "$(nvcc_needs gemm_steps)"      'nvcc_built gemm_steps'
step 'nvcc: test_nccl'                   "$(nvcc_needs test_nccl)"       'nvcc_built test_nccl'
step 'nvcc: comm_bw benchmark'           "$(nvcc_needs comm_bw)"         'nvcc_built comm_bw'
step 'nvcc: hf_logits_cuda'              "$(nvcc_needs hf_logits_cuda)"  'nvcc_built hf_logits_cuda'
step 'nvcc: generate_cuda'               "$(nvcc_needs generate_cuda)"  'nvcc_built generate_cuda'
step 'c99 -pedantic: NCCL backend compiles' "${NCCL:+$B/cc_nccl.o}" \
     'if [ -n "$NCCL" ]; then test -f $B/cc_nccl.o; else echo "SKIP nccl.h not installed"; fi'

# ---- on a GPU (each prints SKIP without one)
step 'test_cuda (needs a GPU)'           "$(nvcc_needs test_cuda)"       'gpu_run test_cuda'
# (flash_test sweeps the mma.sync kernels' tilings: built where a GPU is, see the Makefile)
step 'flash_test (needs a GPU)'          "$(gpu_needs flash_test)"       'gpu_run flash_test'
step 'test_nccl (needs 2 GPUs)'          "$(nvcc_needs test_nccl)"       'gpu_run test_nccl'
