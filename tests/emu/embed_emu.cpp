/* embed_emu.cpp — the embedding backward's kernel (us__k_embedding_bwd, // >>cuda-kernels) on the
   CPU (us_cuda_emu.h), fed the ids sorted stably on the host (what CUB's radix sort gives the
   kernel on the GPU), against the CPU ops' embedding_bwd: the same bits, since both add each
   row's tokens in token order into what dwte held; fp32, bf16 and fp16; ids repeated, ids of
   another rank (negative: skipped), one token, widths under and over the block's threads.
   `make embed-emu` (needs the CUDA headers, not a GPU). CUB's sort itself runs on the GPU only. */
#define ULTRASCALE_IMPLEMENTATION
#include <algorithm>
#include <vector>

#include "../../ultrascale.h"
#include "us_cuda_emu.h"

static emu_dim3 emu_bdim = {256, 1, 1};
#define blockDim emu_bdim

#include "embed_kernel_emu.h" /* made by extract_embed.py */
#include "../us_test.h"

template <typename T>
static int one_case(int64_t N, int64_t V, int64_t C, int neg, us_dtype dt) {
    std::vector<T> dout((size_t)(N * C));
    std::vector<float> dc((size_t)(V * C)), de;
    std::vector<int32_t> tok((size_t)N), key((size_t)N), idx((size_t)N);
    us_ops cpu = us_cpu_ops(1);
    int64_t i;
    for (i = 0; i < N; i++) /* a few ids often, as text does; some another rank's */
        tok[i] = neg && rnd64() % 5 == 0
                     ? -1
                     : (int32_t)(rnd64() % 3 ? rnd64() % (V < 4 ? V : 4) : rnd64() % V);
    for (i = 0; i < N * C; i++) us__st(dout.data(), i, (float)(rnd01() * 2 - 1));
    for (i = 0; i < V * C; i++) dc[i] = (float)(rnd01() * 2 - 1); /* what dwte held */
    de = dc;
    for (i = 0; i < N; i++) idx[i] = (int32_t)i;
    std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return tok[a] < tok[b]; });
    for (i = 0; i < N; i++) key[i] = tok[idx[i]];
    cpu.embedding_bwd(&cpu, dc.data(), dout.data(), tok.data(), N, C, dt);
    emu_launch(
        {(unsigned)N, (unsigned)((C + 255) / 256), 1}, 0,
        [&] { us__k_embedding_bwd<T>(de.data(), dout.data(), key.data(), idx.data(), N, C); }, 256);
    const int same = !memcmp(dc.data(), de.data(), (size_t)(V * C) * 4);
    CHECK(same, "us__k_embedding_bwd %s N %lld V %lld C %lld%s: the CPU's bits", us_dtype_name(dt),
          (long long)N, (long long)V, (long long)C, neg ? ", some ids negative" : "");
    return same;
}

int main(int argc, char **argv) {
    static const int64_t shapes[4][3] = {{1, 5, 64}, {37, 9, 200}, {300, 50, 300}, {64, 2, 600}};
    int s, neg;
    us_test_verbose = argc > 1 && !strcmp(argv[1], "-v");
    for (s = 0; s < 4; s++)
        for (neg = 0; neg < 2; neg++) {
            one_case<float>(shapes[s][0], shapes[s][1], shapes[s][2], neg, US_F32);
            one_case<__nv_bfloat16>(shapes[s][0], shapes[s][1], shapes[s][2], neg, US_BF16);
            one_case<__half>(shapes[s][0], shapes[s][1], shapes[s][2], neg, US_F16);
        }
    return us_test_done("embed_emu");
}
