# ultrascale — build the examples, run the default task, run the tests.
#   make            build the examples into build/
#   make train      learn the built-in task (sorting digits) on the CPU
#   make train-cuda the same trainer compiled by nvcc, on the GPU (also: make CUDA=1)
#   make test       every test: kernels, model, errors, CLIs, compile checks, sanitizers
#   make bench      CPU benchmarks side by side with OpenBLAS (installs libopenblas-dev)
CC      ?= cc
CXX     ?= c++
CUDA_HOME ?= /usr/local/cuda
NVCC    ?= $(shell command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)
ARCH    ?= -march=native
OPENMP  ?= -fopenmp
CFLAGS  ?= -std=c99 -Wall -Wextra -pedantic -O3 $(ARCH) $(OPENMP) -D_POSIX_C_SOURCE=200809L -pthread
LDLIBS  ?= -lm
NVFLAGS ?= -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Xcompiler -fopenmp,-Wall,-Wextra
NVLIBS   = -lcublasLt -lnccl
SANFLAGS = -std=c99 -Wall -Wextra -O1 -g $(ARCH) $(OPENMP) -D_POSIX_C_SOURCE=200809L -pthread -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
B        = build
HDR      = ultrascale.h ultrascale_comm.h

EXAMPLES = $(B)/train $(B)/memory $(B)/quickstart $(B)/dp_quickstart $(B)/cp_memory $(B)/schedule $(B)/hf_logits $(B)/plan $(B)/figures
ifeq ($(CUDA),1)
EXAMPLES += $(B)/train_cuda
endif
TESTS    = $(patsubst tests/%.c,$(B)/%,$(wildcard tests/test_*.c))
SANTESTS = $(patsubst tests/%.c,$(B)/san/%,$(wildcard tests/test_*.c))

all: $(EXAMPLES)

$(B) $(B)/san:
	mkdir -p $@

$(B)/%: examples/%.c $(HDR) | $(B)
	$(CC) $(CFLAGS) $< -o $@ $(LDLIBS)

$(B)/test_%: tests/test_%.c tests/us_test.h tests/us_test_ranks.h $(HDR) | $(B)
	$(CC) $(CFLAGS) $< -o $@ $(LDLIBS)

$(B)/san/test_%: tests/test_%.c tests/us_test.h tests/us_test_ranks.h $(HDR) | $(B)/san
	$(CC) $(SANFLAGS) $< -o $@ $(LDLIBS)

train: $(B)/train
	./$(B)/train

# the same trainer, compiled by nvcc with the CUDA backend
$(B)/train_cuda: examples/train.c $(HDR) ultrascale_cuda.cuh | $(B)
	$(NVCC) $(NVFLAGS) -x cu -DUS_CUDA -DULTRASCALE_NCCL $< -o $@ $(NVLIBS)

# the NCCL backend against host references, on 2 GPUs (prints SKIP with fewer)
$(B)/test_nccl: tests/test_nccl.cu tests/us_test.h $(HDR) ultrascale_cuda.cuh | $(B)
	$(NVCC) $(NVFLAGS) -DULTRASCALE_NCCL $< -o $@ $(NVLIBS)

# a checkpoint's logits computed on the GPU (bench/hf_logits.sh uses it where nvcc and a GPU exist)
$(B)/hf_logits_cuda: examples/hf_logits.c $(HDR) ultrascale_cuda.cuh | $(B)
	$(NVCC) $(NVFLAGS) -x cu -DUS_CUDA $< -o $@ $(NVLIBS)

train-cuda: $(B)/train_cuda
	./$(B)/train_cuda

$(B)/flash_test: tests/flash_test.cu $(HDR) ultrascale_cuda.cuh | $(B)
	$(NVCC) $(NVFLAGS) $< -o $@ $(NVLIBS)

$(B)/gemm_steps: examples/gemm_steps.cu | $(B)
	$(NVCC) $(NVFLAGS) $< -o $@ $(NVLIBS)

$(B)/test_cuda: tests/test_cuda.cu tests/us_test.h $(HDR) ultrascale_cuda.cuh | $(B)
	$(NVCC) $(NVFLAGS) $< -o $@ $(NVLIBS)

# the flash kernels on the CPU through a small CUDA emulator, against the CPU reference: kernel
# logic can be checked on a machine without a GPU (needs the CUDA headers only; ~4 minutes under ASan)
$(B)/flash_emu: tests/emu/flash_emu.cpp tests/emu/us_cuda_emu.h tests/emu/extract_flash.py tests/us_test.h $(HDR) ultrascale_cuda.cuh | $(B)
	python3 tests/emu/extract_flash.py ultrascale_cuda.cuh $(B)/flash_kernels_emu.h
	$(CXX) -std=c++17 -O1 -g -fsanitize=address -fno-omit-frame-pointer $(OPENMP) -w -I$(CUDA_HOME)/include -I$(B) $< -o $@ $(LDLIBS)
flash-emu: $(B)/flash_emu
	ASAN_OPTIONS=detect_stack_use_after_return=0 ./$(B)/flash_emu

# Compile checks: C99 pedantic with -Werror, C++, two translation units, ULTRASCALE_STATIC,
# no OpenMP, and nvcc (the CUDA compiler sees the header as C++) when it is installed.
CHECKS = \
  "c99 -pedantic -Werror::$(CC) -std=c99 -Wall -Wextra -pedantic -Werror -O2 $(OPENMP) -DUS_COMPILE_SINGLE tests/compile_a.c -o $(B)/cc_c99 $(LDLIBS)" \
  "c++ -Werror::$(CXX) -x c++ -std=c++11 -Wall -Wextra -Werror -O2 $(OPENMP) -DUS_COMPILE_SINGLE tests/compile_a.c -o $(B)/cc_cxx $(LDLIBS)" \
  "two translation units::$(CC) -std=c99 -Wall -Wextra -pedantic -Werror -O2 tests/compile_a.c tests/compile_b.c -o $(B)/cc_2tu $(LDLIBS) && ./$(B)/cc_2tu" \
  "ULTRASCALE_STATIC::$(CC) -std=c99 -Wall -Wextra -pedantic -Werror -O2 -DULTRASCALE_STATIC -DUS_COMPILE_SINGLE tests/compile_a.c -o $(B)/cc_static $(LDLIBS)" \
  "without OpenMP::$(CC) -std=c99 -Wall -Wextra -pedantic -Werror -O2 -DUS_COMPILE_SINGLE tests/compile_a.c -o $(B)/cc_noomp $(LDLIBS)" \
  "nvcc (header as C++)::if [ -x $(NVCC) ]; then $(NVCC) -x cu -std=c++17 -Xcompiler -Wall,-Wextra,-Werror -DUS_COMPILE_SINGLE -c tests/compile_a.c -o $(B)/cc_nvcc.o; else echo 'SKIP nvcc not installed'; fi" \
  "nvcc: trainer with CUDA backend::if [ -x $(NVCC) ]; then $(MAKE) -s $(B)/train_cuda; else echo 'SKIP nvcc not installed'; fi" \
  "nvcc: test_cuda::if [ -x $(NVCC) ]; then $(MAKE) -s $(B)/test_cuda; else echo 'SKIP nvcc not installed'; fi" \
  "nvcc: flash_test::if [ -x $(NVCC) ]; then $(MAKE) -s $(B)/flash_test; else echo 'SKIP nvcc not installed'; fi" \
  "nvcc: gemm_steps::if [ -x $(NVCC) ]; then $(MAKE) -s $(B)/gemm_steps; else echo 'SKIP nvcc not installed'; fi" \
  "nvcc: test_nccl::if [ -x $(NVCC) ]; then $(MAKE) -s $(B)/test_nccl; else echo 'SKIP nvcc not installed'; fi" \
  "nvcc: comm_bw benchmark::if [ -x $(NVCC) ]; then $(MAKE) -s $(B)/comm_bw; else echo 'SKIP nvcc not installed'; fi" \
  "nvcc: hf_logits_cuda::if [ -x $(NVCC) ]; then $(MAKE) -s $(B)/hf_logits_cuda; else echo 'SKIP nvcc not installed'; fi" \
  "c99 -pedantic: NCCL backend compiles::if [ -f /usr/include/nccl.h ] || [ -f $(CUDA_HOME)/include/nccl.h ]; then $(CC) -std=c99 -Wall -Wextra -pedantic -Werror -O2 -D_POSIX_C_SOURCE=200809L -DULTRASCALE_NCCL -isystem $(CUDA_HOME)/include -c tests/compile_nccl.c -o $(B)/cc_nccl.o; else echo 'SKIP nccl.h not installed'; fi"

RUNS = \
  "test_dtypes::./$(B)/test_dtypes" \
  "test_gemm::./$(B)/test_gemm" \
  "test_gemm (portable, no AVX2)::$(CC) -std=c99 -Wall -Wextra -pedantic -Werror -O2 $(OPENMP) tests/test_gemm.c -o $(B)/test_gemm_portable $(LDLIBS) && ./$(B)/test_gemm_portable" \
  "test_ops::./$(B)/test_ops" \
  "test_fp8::./$(B)/test_fp8" \
  "test_fp16::./$(B)/test_fp16" \
  "test_fp8_train::./$(B)/test_fp8_train" \
  "test_model::./$(B)/test_model" \
  "test_moe::./$(B)/test_moe" \
  "test_ep::./$(B)/test_ep" \
  "test_errors::./$(B)/test_errors" \
  "test_comm::./$(B)/test_comm" \
  "test_dp::./$(B)/test_dp" \
  "test_tp::./$(B)/test_tp" \
  "test_cp_ops::./$(B)/test_cp_ops" \
  "test_cp::./$(B)/test_cp" \
  "test_pp_sched::./$(B)/test_pp_sched" \
  "test_plan::./$(B)/test_plan" \
  "figures writes the four SVGs::./$(B)/figures $(B) | grep -c 'svg:' | grep -qx 4 && grep -q '</svg>' $(B)/fig_tp_tradeoff.svg" \
  "test_pp::./$(B)/test_pp" \
  "test_ckpt::./$(B)/test_ckpt" \
  "test_ckpt_py (files from Python's safetensors)::bash tests/test_ckpt_py.sh $(B)/test_ckpt" \
  "fuzz corpus replay (asan+ubsan)::./$(B)/fuzz_replay tests/fuzz_corpus/*" \
  "schedule CLI: table and SVG::./$(B)/schedule | grep -q dualpipev && ./$(B)/schedule --schedule interleaved --svg $(B)/il.svg | grep -q wrote && grep -q '<svg' $(B)/il.svg && ./$(B)/schedule --schedule dualpipev --svg $(B)/dpv.svg | grep -q wrote && grep -q 'stroke=\"black\"' $(B)/dpv.svg && ! ./$(B)/schedule --pp 0 2>/dev/null && ! ./$(B)/schedule --schedule dualpipev --m 6 2>/dev/null" \
  "test_comm_threads::./$(B)/test_comm_threads" \
  "test_bootstrap::./$(B)/test_bootstrap" \
  "test_nccl (needs 2 GPUs)::if [ -x $(B)/test_nccl ]; then ./$(B)/test_nccl; else echo 'SKIP not built'; fi" \
  "train CLI::bash tests/test_train_cli.sh $(B)/train" \
  "quick start runs::./$(B)/quickstart | grep -q 'step 300 loss'" \
  "dp quick start runs (4 threads, ZeRO-2)::./$(B)/dp_quickstart | grep -q 'step 100 loss'" \
  "cp_memory prints the table::./$(B)/cp_memory | grep -q '^  131072'" \
  "memory CLI::bash tests/test_memory_cli.sh $(B)/memory" \
  "plan CLI::bash tests/test_plan_cli.sh $(B)/plan $(B)/train" \
  "calibrate_cpu writes a rates file plan reads::./$(B)/calibrate_cpu --quick --out $(B)/rates_cpu.txt | grep -q wrote && ./$(B)/plan --rates $(B)/rates_cpu.txt --model llama-1b --top 1 | grep -q '^top'" \
  "test_cuda (needs a GPU)::if [ -x $(B)/test_cuda ]; then ./$(B)/test_cuda; else echo 'SKIP not built'; fi" \
  "flash_test (needs a GPU)::if [ -x $(B)/flash_test ]; then ./$(B)/flash_test; else echo 'SKIP not built'; fi" \
  "asan+ubsan test_dtypes::./$(B)/san/test_dtypes" \
  "asan+ubsan test_ops::./$(B)/san/test_ops" \
  "asan+ubsan test_fp8::./$(B)/san/test_fp8" \
  "asan+ubsan test_fp16::./$(B)/san/test_fp16 --quick" \
  "asan+ubsan test_fp8_train::./$(B)/san/test_fp8_train --quick" \
  "asan+ubsan test_gemm::./$(B)/san/test_gemm" \
  "asan+ubsan test_model::./$(B)/san/test_model --quick" \
  "asan+ubsan test_moe::./$(B)/san/test_moe" \
  "asan+ubsan test_ep::./$(B)/san/test_ep" \
  "asan+ubsan test_errors::./$(B)/san/test_errors" \
  "asan+ubsan test_comm::./$(B)/san/test_comm" \
  "asan+ubsan test_dp::./$(B)/san/test_dp" \
  "asan+ubsan test_tp::./$(B)/san/test_tp" \
  "asan+ubsan test_cp_ops::./$(B)/san/test_cp_ops" \
  "asan+ubsan test_cp::./$(B)/san/test_cp" \
  "asan+ubsan test_pp_sched::./$(B)/san/test_pp_sched" \
  "asan+ubsan test_plan::./$(B)/san/test_plan" \
  "asan+ubsan test_pp::./$(B)/san/test_pp" \
  "asan+ubsan test_ckpt::./$(B)/san/test_ckpt" \
  "asan+ubsan test_comm_threads::./$(B)/san/test_comm_threads" \
  "asan+ubsan test_bootstrap::./$(B)/san/test_bootstrap"

# the checkpoint readers' fuzz target without an engine: replays tests/fuzz_corpus (make test)
$(B)/fuzz_replay: tests/fuzz_safetensors.c $(HDR) | $(B)
	$(CC) $(SANFLAGS) $< -o $@ $(LDLIBS)

# libFuzzer + ASan/UBSan (clang): at least 10^6 executions over the corpus; new finds go to
# $(B)/fuzz_corpus_new (copy small interesting ones into tests/fuzz_corpus). Not part of make test.
FUZZ_RUNS ?= 1000000
$(B)/fuzz_safetensors: tests/fuzz_safetensors.c $(HDR) | $(B)
	clang -g -O1 -fsanitize=fuzzer,address,undefined -DUS_FUZZ_ENGINE -D_POSIX_C_SOURCE=200809L $< -o $@ $(LDLIBS)
fuzz: $(B)/fuzz_safetensors
	mkdir -p $(B)/fuzz_corpus_new
	./$(B)/fuzz_safetensors -runs=$(FUZZ_RUNS) -max_len=4096 $(B)/fuzz_corpus_new tests/fuzz_corpus

test: $(EXAMPLES) $(TESTS) $(SANTESTS) $(B)/fuzz_replay $(B)/calibrate_cpu
	@bash tests/run_all.sh $(CHECKS) $(RUNS)

# ---- benchmarks (not tests): need OpenBLAS for the side-by-side GEMM
bench: $(B)/bench_cpu
	./$(B)/bench_cpu

$(B)/bench_cpu: bench/bench_cpu.c $(HDR) | $(B)
	@[ -f /usr/include/x86_64-linux-gnu/cblas.h ] || [ -f /usr/include/cblas.h ] || \
	  (apt-get update -qq && apt-get install -y -qq libopenblas-dev) || (echo "bench: install libopenblas-dev" && false)
	$(CC) $(CFLAGS) -I/usr/include/x86_64-linux-gnu $< -o $@ -lopenblas $(LDLIBS)

clean:
	rm -rf $(B)

.PHONY: all train train-cuda test bench clean flash-emu fuzz

# ---- GPU benchmarks (run on the GPU machine; see bench/run_gpu.sh)
$(B)/bench_cuda: bench/bench_cuda.cu $(HDR) ultrascale_cuda.cuh | $(B)
	$(NVCC) $(NVFLAGS) $< -o $@ $(NVLIBS)

# the comm seam's NCCL backend against raw NCCL, bus bandwidth 1 MB - 1 GB (2+ GPUs; issue 9)
$(B)/comm_bw: bench/comm_bw.cu $(HDR) | $(B)
	$(NVCC) $(NVFLAGS) -DULTRASCALE_NCCL $< -o $@ $(NVLIBS)

# the same rates file from the CPU ops and the threads backend (CI reads it back through build/plan)
$(B)/calibrate_cpu: bench/calibrate_cpu.c $(HDR) | $(B)
	$(CC) $(CFLAGS) $< -o $@ $(LDLIBS)

# the planner's rates measured on this machine (GEMM, attention, HBM, NCCL on 2 GPUs): bench/calibrate.cu
$(B)/calibrate: bench/calibrate.cu $(HDR) ultrascale_cuda.cuh | $(B)
	$(NVCC) $(NVFLAGS) $< -o $@ $(NVLIBS)
