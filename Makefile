# ultrascale — build the examples, run the default task, run the tests.
#   make            build the examples into build/
#   make train      learn the built-in task (sorting digits) on the CPU
#   make train-cuda the same trainer compiled by nvcc, on the GPU (also: make CUDA=1)
#   make test       every test: kernels, model, errors, CLIs, compile checks, sanitizers
#                   (the steps are listed in tests/steps.sh; JOBS=N runs N at a time, default
#                   one more than the cores)
#   make bench      CPU benchmarks side by side with OpenBLAS (installs libopenblas-dev)
CC      ?= cc
CXX     ?= c++
CUDA_HOME ?= /usr/local/cuda
NVCC    ?= $(shell command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)
ARCH    ?= -march=native
OPENMP  ?= -fopenmp
# -O2, not -O3: the implementation compiles in half the CPU time (7.7 s against 16.1 s, gcc 12) and
# the built-in task trains 7 % slower (make train is compile + run; the CUDA build is NVFLAGS)
CFLAGS  ?= -std=c99 -Wall -Wextra -pedantic -O2 $(ARCH) $(OPENMP) -D_POSIX_C_SOURCE=200809L -pthread
LDLIBS  ?= -lm
# NVOPT: nvcc's -O sets the host code's level only (ptxas compiles the kernels at its -O3 either
# way); -O2 as in CFLAGS, since -O3 costs the CUDA implementation's host part a third more time.
# NVARCH: the device code in the objects, SASS for sm_90a (H100, H200). make test on a machine
# without a GPU, where nothing runs the kernels, asks for unoptimised PTX only (code=compute_90a,
# NVVM at -O0, host -O0: NVCHECK below): every kernel still goes through nvcc's front end and
# code generation, and the optimiser and ptxas's assembly into SASS are left to the machines that
# run them (the CUDA implementation: 104 s of CPU with SASS, 16 s unoptimised PTX)
NVARCH  ?= -gencode arch=compute_90a,code=sm_90a
NVOPT   ?= -O2
NVFLAGS ?= $(NVOPT) -std=c++17 $(NVARCH) -Xcompiler -fopenmp,-Wall,-Wextra
NVLIBS   = -lcublasLt -lnccl
# -g1: line tables only, what the sanitizers' reports need for FILE:LINE (-g compiles slower)
SANFLAGS = -std=c99 -Wall -Wextra -O1 -g1 $(ARCH) $(OPENMP) -D_POSIX_C_SOURCE=200809L -pthread -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
B        = build
HDR      = ultrascale.h ultrascale_comm.h
# one job more than cores: a step that waits (the threads backend's ranks take turns, a program
# loading a library) leaves its core to the extra job (make test: 213 s with 2 jobs, 190 s with 3)
JOBS    ?= $(shell echo $$(($$(nproc 2>/dev/null || echo 2) + 1)))

EXAMPLES = $(B)/train $(B)/memory $(B)/quickstart $(B)/dp_quickstart $(B)/cp_memory $(B)/schedule $(B)/hf_logits $(B)/plan $(B)/figures \
           $(B)/readme_snippet $(B)/tokenize $(B)/generate
ifeq ($(CUDA),1)
EXAMPLES += $(B)/train_cuda
endif

all: $(EXAMPLES)

$(B) $(B)/san $(B)/cuda:
	mkdir -p $@

# ---- the implementation, compiled once per flag set
# tests/us_impl.c is the three headers' implementation in one translation unit. It is compiled
# once with CFLAGS ($(B)/ultrascale.o), once with SANFLAGS ($(B)/san/ultrascale.o) and, where nvcc
# is installed, once by nvcc with the CUDA backend ($(B)/cuda/ultrascale.o); the examples and
# tests link against it. They keep their `#define ULTRASCALE_IMPLEMENTATION` (each still builds
# alone, `cc examples/train.c`): LINKED predefines the headers' include-once guards, so there the
# define brings the declarations only (and none of the implementation's #includes: LINKED_C makes a
# function used without its header an error).
LINKED      = -DULTRASCALE_IMPLEMENTATION_DONE -DULTRASCALE_COMM_IMPLEMENTATION_DONE
LINKED_C    = $(LINKED) -Werror=implicit-function-declaration
LINKED_CUDA = $(LINKED) -DULTRASCALE_CUDA_IMPLEMENTATION_DONE
IMPL        = $(B)/ultrascale.o
SANIMPL     = $(B)/san/ultrascale.o
CUDAIMPL    = $(B)/cuda/ultrascale.o
NVSTAMP     = $(B)/cuda/nvflags
TESTHDR     = tests/us_test.h tests/us_test_ranks.h
# the four tests compiled inside the implementation's objects (below: build/test_internal)
INTERNAL     = test_dp test_tp test_fp8_train test_moe
INTERNAL_SRC = tests/test_internal.c $(INTERNAL:%=tests/%.c) $(TESTHDR)

# (its compiler messages are kept in $(B)/ultrascale.warnings, shown as usual: make test's step
# "the implementation compiles without a warning" fails when there is one, so this one compile
# is also the check of the optimiser's warnings over the whole implementation at -O2)
$(IMPL): tests/us_impl.c $(HDR) $(INTERNAL_SRC) | $(B)
	$(CC) $(CFLAGS) -c $< -o $@ 2> $(B)/ultrascale.warnings; st=$$?; cat $(B)/ultrascale.warnings >&2; exit $$st

$(SANIMPL): tests/us_impl.c $(HDR) $(INTERNAL_SRC) | $(B)/san
	$(CC) $(SANFLAGS) -c $< -o $@

$(CUDAIMPL): tests/us_impl.c $(HDR) ultrascale_cuda.cuh $(NVSTAMP) | $(B)/cuda
	$(NVCC) $(NVFLAGS) -x cu -DUS_CUDA -DULTRASCALE_NCCL -c $< -o $@

# nvcc's flags as last used; every nvcc build depends on this file, rewritten only when they change
# (so a `make build/test_cuda` after a GPU-less make test builds SASS again, never links PTX)
$(NVSTAMP): FORCE | $(B)/cuda
	@echo '$(NVCC) $(NVFLAGS)' | cmp -s - $@ || echo '$(NVCC) $(NVFLAGS)' > $@
FORCE:

$(B)/%: examples/%.c $(IMPL) $(HDR) | $(B)
	$(CC) $(CFLAGS) $(LINKED_C) $< $(IMPL) -o $@ $(LDLIBS)

# the README's example (examples/readme_snippet.c) as C++ too; -Wextra's missing-field-initializers
# would call the C idiom `us_model_config mc = {0}` incomplete there
$(B)/readme_snippet_cxx: examples/readme_snippet.c $(IMPL) $(HDR) | $(B)
	$(CXX) -x c++ -std=c++11 -Wall -Wextra -Wno-missing-field-initializers -Werror -O2 $(OPENMP) $(LINKED) $< -x none $(IMPL) -o $@ $(LDLIBS)

# ---- tests: one program per area (tests/test_*.c), each built with CFLAGS and with the sanitizers
# (test_internal holds INTERNAL, below)
TEST_SRC = $(filter-out $(INTERNAL:%=tests/%.c) tests/test_internal_main.c, \
                        $(wildcard tests/test_*.c))
TESTS    = $(patsubst tests/%.c,$(B)/%,$(TEST_SRC))
SANTESTS = $(patsubst tests/%.c,$(B)/san/%,$(TEST_SRC))

$(B)/test_%: tests/test_%.c $(TESTHDR) $(IMPL) $(HDR) | $(B)
	$(CC) $(CFLAGS) $(LINKED_C) $< $(IMPL) -o $@ $(LDLIBS)

$(B)/san/test_%: tests/test_%.c $(TESTHDR) $(SANIMPL) $(HDR) | $(B)/san
	$(CC) $(SANFLAGS) $(LINKED_C) $< $(SANIMPL) -o $@ $(LDLIBS)

# These tests use the implementation's private functions and types, so they are compiled inside
# its translation unit: tests/us_impl.c includes tests/test_internal.c (INTERNAL's four, one
# program: `test_internal dp` runs test_dp.c), and build/test_internal is a main linked against
# $(IMPL) (the sanitizer one against $(SANIMPL)). test_gemm reaches little of the implementation
# and compiles what it reaches alone, under ULTRASCALE_STATIC.
$(B)/test_internal: tests/test_internal_main.c $(IMPL) | $(B)
	$(CC) $(CFLAGS) $< $(IMPL) -o $@ $(LDLIBS)

$(B)/san/test_internal: tests/test_internal_main.c $(SANIMPL) | $(B)/san
	$(CC) $(SANFLAGS) $< $(SANIMPL) -o $@ $(LDLIBS)

$(B)/test_gemm: tests/test_gemm.c $(TESTHDR) $(HDR) | $(B)
	$(CC) $(CFLAGS) -DULTRASCALE_STATIC $< -o $@ $(LDLIBS)

$(B)/san/test_gemm: tests/test_gemm.c $(TESTHDR) $(HDR) | $(B)/san
	$(CC) $(SANFLAGS) -DULTRASCALE_STATIC $< -o $@ $(LDLIBS)

# the GEMM's portable kernels: the same test without -march=native (no AVX2)
$(B)/test_gemm_portable: tests/test_gemm.c $(HDR) | $(B)
	$(CC) -std=c99 -Wall -Wextra -pedantic -Werror -O2 $(OPENMP) -DULTRASCALE_STATIC $< -o $@ $(LDLIBS)

# the checkpoint readers' fuzz target without an engine: replays tests/fuzz_corpus (make test)
$(B)/fuzz_replay: tests/fuzz_safetensors.c $(SANIMPL) $(HDR) | $(B)
	$(CC) $(SANFLAGS) $(LINKED_C) $< $(SANIMPL) -o $@ $(LDLIBS)

# ---- compile checks: C99 pedantic with -Werror, C++, two translation units, ULTRASCALE_STATIC,
# no OpenMP; nvcc (which sees the header as C++) and the NCCL backend where they are installed.
# The optimiser's warnings (-O2: maybe-uninitialized, array-bounds, ...) over the whole
# implementation come from $(IMPL)'s own compile (above: its messages must be empty); cc_2tu
# (C99 pedantic -Werror, without OpenMP and without _POSIX_C_SOURCE: the header's fallbacks)
# checks the front end's at -O0, a third of the time; the C++ build checks C++'s front
# end over the same code at -O0, and the NCCL build compiles ultrascale_comm.h whole at -O2 and
# ultrascale.h under ULTRASCALE_STATIC (parsed and checked, the parts it does not reach not
# optimised again: a sixth of the time)
WERROR = -std=c99 -Wall -Wextra -pedantic -Werror -O2

$(B)/cc_cxx: tests/compile_a.c $(HDR) | $(B)
	$(CXX) -x c++ -std=c++11 -Wall -Wextra -Werror -O0 $(OPENMP) -DUS_COMPILE_SINGLE $< -o $@ $(LDLIBS)

# also the build without OpenMP (no -fopenmp here; its step checks that no OpenMP call is linked in)
$(B)/cc_2tu: tests/compile_a.c tests/compile_b.c $(HDR) | $(B)
	$(CC) $(WERROR) -O0 tests/compile_a.c tests/compile_b.c -o $@ $(LDLIBS)

$(B)/cc_static: tests/compile_a.c $(HDR) | $(B)
	$(CC) $(WERROR) -DULTRASCALE_STATIC -DUS_COMPILE_SINGLE $< -o $@ $(LDLIBS)

$(B)/cc_nvcc.o: tests/compile_a.c $(HDR) | $(B)
	$(NVCC) -x cu -std=c++17 -Xcompiler -Wall,-Wextra,-Werror -DUS_COMPILE_SINGLE -c $< -o $@

$(B)/cc_nccl.o: tests/compile_nccl.c $(HDR) | $(B)
	$(CC) $(WERROR) -D_POSIX_C_SOURCE=200809L -DULTRASCALE_NCCL -DULTRASCALE_STATIC -isystem $(CUDA_HOME)/include -c $< -o $@

# the stb-style opt-outs: the library without its checkpoints, its planner, its data loading, its
# tokenizer
OPTOUTS = CHECKPOINT PLANNER DATA TOKENIZER
$(OPTOUTS:%=$(B)/cc_no_%): $(B)/cc_no_%: tests/compile_optout.c $(HDR) | $(B)
	$(CC) -std=c99 -Wall -Wextra -pedantic -Werror -O0 -pthread -DULTRASCALE_NO_$* $< -o $@ $(LDLIBS)

CHECKS = $(B)/cc_cxx $(B)/cc_2tu $(B)/cc_static $(OPTOUTS:%=$(B)/cc_no_%)

# ---- nvcc builds: the trainer with the CUDA backend, the GPU tests and benchmarks
# The trainer, hf_logits, test_cuda and comm_bw link against $(CUDAIMPL). flash_test calls the
# flash kernels' private launchers with their internal tilings, so it compiles them in (the header's
# // >>cuda-flash chapter alone: tests/flash_test.cu defines US__CUDA_FLASH_ONLY); make test builds
# it only where a GPU is present (its sweep of tilings the library does not use is 18 s of nvcc,
# and the kernels themselves are compiled into $(CUDAIMPL) everywhere); test_nccl
# compiles ultrascale.h and ultrascale_comm.h in, under ULTRASCALE_STATIC (the code it does not
# reach is left out, which takes less time than waiting for $(CUDAIMPL)).
train: $(B)/train
	./$(B)/train

# the same trainer, compiled by nvcc with the CUDA backend
$(B)/train_cuda: examples/train.c $(CUDAIMPL) $(HDR) ultrascale_cuda.cuh $(NVSTAMP) | $(B)
	$(NVCC) $(NVFLAGS) -x cu -DUS_CUDA -DULTRASCALE_NCCL $(LINKED_CUDA) -c $< -o $@.o
	$(NVCC) $(NVFLAGS) $@.o $(CUDAIMPL) -o $@ $(NVLIBS)

train-cuda: $(B)/train_cuda
	./$(B)/train_cuda

# a checkpoint's logits computed on the GPU (bench/hf_logits.sh uses it where nvcc and a GPU exist)
$(B)/hf_logits_cuda: examples/hf_logits.c $(CUDAIMPL) $(HDR) ultrascale_cuda.cuh $(NVSTAMP) | $(B)
	$(NVCC) $(NVFLAGS) -x cu -DUS_CUDA $(LINKED_CUDA) -c $< -o $@.o
	$(NVCC) $(NVFLAGS) $@.o $(CUDAIMPL) -o $@ $(NVLIBS)

# text from a checkpoint with a KV cache, on GPU 0 (examples/generate.c)
$(B)/generate_cuda: examples/generate.c $(CUDAIMPL) $(HDR) ultrascale_cuda.cuh $(NVSTAMP) | $(B)
	$(NVCC) $(NVFLAGS) -x cu -DUS_CUDA $(LINKED_CUDA) -c $< -o $@.o
	$(NVCC) $(NVFLAGS) $@.o $(CUDAIMPL) -o $@ $(NVLIBS)

$(B)/test_cuda: tests/test_cuda.cu tests/us_test.h $(CUDAIMPL) $(HDR) ultrascale_cuda.cuh $(NVSTAMP) | $(B)
	$(NVCC) $(NVFLAGS) $(LINKED_CUDA) $< $(CUDAIMPL) -o $@ $(NVLIBS)

# the NCCL backend against host references, on 2 GPUs (prints SKIP with fewer)
$(B)/test_nccl: tests/test_nccl.cu tests/us_test.h $(HDR) ultrascale_cuda.cuh $(NVSTAMP) | $(B)
	$(NVCC) $(NVFLAGS) -DULTRASCALE_STATIC -DULTRASCALE_NCCL $< -o $@ $(NVLIBS)

$(B)/flash_test: tests/flash_test.cu $(HDR) ultrascale_cuda.cuh $(NVSTAMP) | $(B)
	$(NVCC) $(NVFLAGS) -DULTRASCALE_STATIC $< -o $@ $(NVLIBS)

$(B)/gemm_steps: examples/gemm_steps.cu $(NVSTAMP) | $(B)
	$(NVCC) $(NVFLAGS) $< -o $@ $(NVLIBS)

# the comm seam's NCCL backend against raw NCCL, bus bandwidth 1 MB - 1 GB (2+ GPUs; issue 9)
$(B)/comm_bw: bench/comm_bw.cu $(CUDAIMPL) $(HDR) $(NVSTAMP) | $(B)
	$(NVCC) $(NVFLAGS) -DULTRASCALE_NCCL $(LINKED_CUDA) $< $(CUDAIMPL) -o $@ $(NVLIBS)

# longest first, so two jobs keep both cores busy
NVCC_BUILDS = $(if $(HAVE_GPU),$(B)/flash_test) $(B)/test_nccl $(B)/train_cuda $(B)/test_cuda \
              $(B)/hf_logits_cuda $(B)/generate_cuda $(B)/comm_bw $(B)/gemm_steps $(B)/cc_nvcc.o

# the flash kernels on the CPU through a small CUDA emulator, against the CPU reference: kernel
# logic can be checked on a machine without a GPU (needs the CUDA headers only; ~4 minutes under ASan)
$(B)/flash_emu: tests/emu/flash_emu.cpp tests/emu/us_cuda_emu.h tests/emu/extract_flash.py tests/emu/extract_common.py tests/us_test.h $(HDR) ultrascale_cuda.cuh | $(B)
	python3 tests/emu/extract_flash.py ultrascale_cuda.cuh $(B)/flash_kernels_emu.h
	$(CXX) -std=c++17 -O1 -g -fsanitize=address -fno-omit-frame-pointer $(OPENMP) -w -I$(CUDA_HOME)/include -I$(B) $< -o $@ $(LDLIBS)
flash-emu: $(B)/flash_emu
	ASAN_OPTIONS=detect_stack_use_after_return=0 ./$(B)/flash_emu
# the same for the grouped GEMM kernel (// >>cuda-grouped) against the CPU's per-group GEMMs (~2 minutes)
$(B)/grouped_emu: tests/emu/grouped_emu.cpp tests/emu/us_cuda_emu.h tests/emu/extract_flash.py tests/emu/extract_grouped.py tests/emu/extract_common.py tests/us_test.h $(HDR) ultrascale_cuda.cuh | $(B)
	python3 tests/emu/extract_flash.py ultrascale_cuda.cuh $(B)/flash_kernels_emu.h
	python3 tests/emu/extract_grouped.py ultrascale_cuda.cuh $(B)/grouped_kernel_emu.h
	$(CXX) -std=c++17 -O1 -g -fsanitize=address -fno-omit-frame-pointer $(OPENMP) -w -I$(CUDA_HOME)/include -I$(B) $< -o $@ $(LDLIBS)
grouped-emu: $(B)/grouped_emu
	ASAN_OPTIONS=detect_stack_use_after_return=0 ./$(B)/grouped_emu

# SwiGLU's fused backward quantisation (// >>cuda-fp8) on the CPU through the same emulator, against
# the unfused pair of kernels and the CPU's quantiser, bit for bit
$(B)/fp8_emu: tests/emu/fp8_emu.cpp tests/emu/us_cuda_emu.h tests/emu/extract_fp8.py tests/emu/extract_common.py tests/us_test.h $(HDR) ultrascale_cuda.cuh | $(B)
	python3 tests/emu/extract_fp8.py ultrascale_cuda.cuh $(B)/fp8_kernels_emu.h
	$(CXX) -std=c++17 -O1 -g -fsanitize=address -fno-omit-frame-pointer $(OPENMP) -w -I$(CUDA_HOME)/include -I$(B) $< -o $@ $(LDLIBS)
fp8-emu: $(B)/fp8_emu
	ASAN_OPTIONS=detect_stack_use_after_return=0 ./$(B)/fp8_emu
# the BLOCK128 quantiser (the weight cache's W and Wᵀ) the same way, against the CPU's quantiser
$(B)/fp8_block_emu: tests/emu/fp8_block_emu.cpp tests/emu/us_cuda_emu.h tests/emu/extract_fp8_block.py tests/emu/extract_common.py tests/us_test.h $(HDR) ultrascale_cuda.cuh | $(B)
	python3 tests/emu/extract_fp8_block.py ultrascale_cuda.cuh $(B)/fp8_block_kernel_emu.h
	$(CXX) -std=c++17 -O1 -g -fsanitize=address -fno-omit-frame-pointer $(OPENMP) -w -I$(CUDA_HOME)/include -I$(B) $< -o $@ $(LDLIBS)
fp8-block-emu: $(B)/fp8_block_emu
	ASAN_OPTIONS=detect_stack_use_after_return=0 ./$(B)/fp8_block_emu

# RMSNorm's one-pass backward (dx and dw's partial sums) the same way, against the CPU's rmsnorm_bwd
$(B)/rmsnorm_emu: tests/emu/rmsnorm_emu.cpp tests/emu/us_cuda_emu.h tests/emu/extract_rmsnorm.py tests/emu/extract_common.py tests/us_test.h $(HDR) ultrascale_cuda.cuh | $(B)
	python3 tests/emu/extract_rmsnorm.py ultrascale_cuda.cuh $(B)/rmsnorm_kernel_emu.h
	$(CXX) -std=c++17 -O1 -g -fsanitize=address -fno-omit-frame-pointer $(OPENMP) -w -I$(CUDA_HOME)/include -I$(B) $< -o $@ $(LDLIBS)
rmsnorm-emu: $(B)/rmsnorm_emu
	ASAN_OPTIONS=detect_stack_use_after_return=0 ./$(B)/rmsnorm_emu

# the embedding backward's kernel (each id's sorted run added in token order) the same way, fed a
# stable sort made on the host, against the CPU's embedding_bwd, bit for bit
$(B)/embed_emu: tests/emu/embed_emu.cpp tests/emu/us_cuda_emu.h tests/emu/extract_embed.py tests/emu/extract_common.py tests/us_test.h $(HDR) ultrascale_cuda.cuh | $(B)
	python3 tests/emu/extract_embed.py ultrascale_cuda.cuh $(B)/embed_kernel_emu.h
	$(CXX) -std=c++17 -O1 -g -fsanitize=address -fno-omit-frame-pointer $(OPENMP) -w -I$(CUDA_HOME)/include -I$(B) $< -o $@ $(LDLIBS)
embed-emu: $(B)/embed_emu
	ASAN_OPTIONS=detect_stack_use_after_return=0 ./$(B)/embed_emu

# the Hopper attention kernels' tile order (bands of (batch, kv head) pairs) on the CPU: every
# query tile and key block once, in order, at every band width (a step of make test; < 1 s)
$(B)/band_emu: tests/emu/band_emu.cpp tests/emu/us_cuda_emu.h tests/emu/extract_band.py tests/emu/extract_common.py tests/us_test.h ultrascale_cuda.cuh | $(B)
	python3 tests/emu/extract_band.py ultrascale_cuda.cuh $(B)/band_order_emu.h
	$(CXX) -std=c++17 -O1 -w -I$(CUDA_HOME)/include -I$(B) $< -o $@

# libFuzzer + ASan/UBSan (clang): at least 10^6 executions over the corpus; new finds go to
# $(B)/fuzz_corpus_new (copy small interesting ones into tests/fuzz_corpus). Not part of make test.
FUZZ_RUNS ?= 1000000
$(B)/fuzz_safetensors: tests/fuzz_safetensors.c $(HDR) | $(B)
	clang -g -O1 -fsanitize=fuzzer,address,undefined -DUS_FUZZ_ENGINE -D_POSIX_C_SOURCE=200809L $< -o $@ $(LDLIBS)
fuzz: $(B)/fuzz_safetensors
	mkdir -p $(B)/fuzz_corpus_new
	./$(B)/fuzz_safetensors -runs=$(FUZZ_RUNS) -max_len=4096 $(B)/fuzz_corpus_new tests/fuzz_corpus

# ---- make test: the steps tests/steps.sh lists. Make builds what each step needs and runs the
# step as soon as that is built, $(JOBS) jobs at a time unless you give -j (JOBS=1: one at a
# time); a step whose program failed to build fails as "not run", after the compiler's errors.
# Each step prints one line as it ends; the failures are repeated at the end above the total. The
# objects most programs link against are made first (the CUDA one, the longest job, where nvcc is),
# then the steps' needs in tests/steps.sh's order.
HAVE_NVCC := $(shell [ -x "$(NVCC)" ] && echo 1)
HAVE_NCCL := $(shell [ -f /usr/include/nccl.h ] || [ -f $(CUDA_HOME)/include/nccl.h ] && echo 1)
# a GPU: its device node, or nvidia-smi listing one
HAVE_GPU  := $(shell { ls /dev/nvidia[0-9]* || nvidia-smi -L | grep -q '^GPU'; } \
                      > /dev/null 2>&1 && echo 1)
STEPS_ENV  = B=$(B) NVCC=$(HAVE_NVCC) NCCL=$(HAVE_NCCL) GPU=$(HAVE_GPU)
# without a GPU the CUDA programs are built to be checked, not run: unoptimised PTX (NVARCH)
NVCHECK    = NVARCH='-gencode arch=compute_90a,code=compute_90a -Xcicc -O0' NVOPT=-O0

test:
	@mkdir -p $(B)/san $(B)/cuda && rm -rf $(B)/steps
	@$(STEPS_ENV) bash tests/run_all.sh --makefile tests/steps.sh > $(B)/steps.mk
	@$(MAKE) -k $(if $(filter -j%,$(MAKEFLAGS)),,-j$(JOBS)) -f $(firstword $(MAKEFILE_LIST)) -f $(B)/steps.mk \
	  $(if $(HAVE_GPU),,$(NVCHECK)) $(if $(HAVE_NVCC),$(CUDAIMPL)) $(IMPL) $(SANIMPL) test-steps || true
	@$(STEPS_ENV) bash tests/run_all.sh --report tests/steps.sh

# every program the steps need, without running them (then: bash tests/run_all.sh tests/steps.sh)
TEST_BUILDS = $(EXAMPLES) $(B)/readme_snippet_cxx $(TESTS) $(SANTESTS) $(B)/test_gemm_portable $(B)/fuzz_replay \
              $(B)/calibrate_cpu $(CHECKS) $(if $(HAVE_NCCL),$(B)/cc_nccl.o) $(if $(HAVE_NVCC),$(NVCC_BUILDS))
test-builds: $(TEST_BUILDS)

# ---- benchmarks (not tests): need OpenBLAS for the side-by-side GEMM
bench: $(B)/bench_cpu
	./$(B)/bench_cpu

# the CPU benchmark measures the library as it runs at -O3 (bench/RESULTS.md), not the test build
$(B)/bench_cpu: bench/bench_cpu.c $(HDR) | $(B)
	@[ -f /usr/include/x86_64-linux-gnu/cblas.h ] || [ -f /usr/include/cblas.h ] || \
	  (apt-get update -qq && apt-get install -y -qq libopenblas-dev) || (echo "bench: install libopenblas-dev" && false)
	$(CC) $(CFLAGS) -O3 -I/usr/include/x86_64-linux-gnu $< -o $@ -lopenblas $(LDLIBS)

clean:
	rm -rf $(B)

# the committed figures in docs/ against what the programs draw now, the planner's heatmap included
# (build/plan --sweep: about 95 s of CPU, so make test checks the others only)
figures-check: $(B)/figures $(B)/schedule $(B)/plan
	bash tests/figures_check.sh $(B) --heatmap

# ---- the layout (.clang-format): one statement per line, at most 100 columns. clang-format 14
# applies it (other versions lay some lines out differently); make test checks it
# (tests/format_check.sh).
FORMAT_SRC = ultrascale.h ultrascale_comm.h ultrascale_cuda.cuh $(wildcard examples/*.c examples/*.cu \
             tests/*.c tests/*.cu tests/*.h tests/emu/*.cpp tests/emu/*.h bench/*.c bench/*.cu)
CLANG_FORMAT ?= $(shell command -v clang-format-14 2>/dev/null || \
                  (clang-format --version 2>/dev/null | grep -q 'version 14\.' && command -v clang-format))
format:
	@[ -n "$(CLANG_FORMAT)" ] || { echo "make format: needs clang-format 14 (apt-get install clang-format-14)"; exit 1; }
	$(CLANG_FORMAT) -i $(FORMAT_SRC)

.PHONY: all train train-cuda test test-builds bench clean flash-emu grouped-emu fp8-emu fp8-block-emu rmsnorm-emu embed-emu fuzz format figures-check FORCE

# ---- GPU benchmarks (run on the GPU machine; see bench/run_gpu.sh)
$(B)/bench_cuda: bench/bench_cuda.cu $(HDR) ultrascale_cuda.cuh $(NVSTAMP) | $(B)
	$(NVCC) $(NVFLAGS) $< -o $@ $(NVLIBS)

# the attention kernels as a shared library, for bench/attn_ab.py (ours and SDPA in one process)
$(B)/libus_attn.so: bench/attn_lib.cu $(HDR) ultrascale_cuda.cuh $(NVSTAMP) | $(B)
	$(NVCC) $(NVFLAGS) -shared -Xcompiler -fPIC $< -o $@ $(NVLIBS)

# the tokenizer's encoding speed (bench/bench_tok.py runs it beside Hugging Face tokenizers)
$(B)/bench_tok: bench/bench_tok.c $(IMPL) $(HDR) | $(B)
	$(CC) $(CFLAGS) $(LINKED_C) $< $(IMPL) -o $@ $(LDLIBS)

# the shard loader's speed: mapped, read with stdio, against reading a shard whole (bench/RESULTS.md)
$(B)/bench_loader: bench/bench_loader.c $(IMPL) $(HDR) | $(B)
	$(CC) $(CFLAGS) $(LINKED_C) $< $(IMPL) -o $@ $(LDLIBS)

# the same rates file from the CPU ops and the threads backend (CI reads it back through build/plan)
$(B)/calibrate_cpu: bench/calibrate_cpu.c $(IMPL) $(HDR) | $(B)
	$(CC) $(CFLAGS) $(LINKED_C) $< $(IMPL) -o $@ $(LDLIBS)

# the planner's rates measured on this machine (GEMM, attention, HBM, NCCL on 2 GPUs): bench/calibrate.cu
$(B)/calibrate: bench/calibrate.cu $(HDR) ultrascale_cuda.cuh $(NVSTAMP) | $(B)
	$(NVCC) $(NVFLAGS) $< -o $@ $(NVLIBS)
