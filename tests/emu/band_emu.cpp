/* band_emu.cpp — the Hopper attention kernels' tile order (us__hop_qtile_of, us__hop_kblock_of,
   us__hop_snake; // >>cuda-hopper) on the CPU, at every band width from 1 pair to all of them:
   - the forward's and dQ's query tiles: tiles 0..U−1 name every (query block, head, batch) once;
     each band holds pairs band·P.. (the last band fewer); within a band the tiles come longest
     first, and a group's heads are consecutive; with one band, the order is the one before
     bands (the last query block of every head and batch, heads fastest);
   - the persistent walk: the CTAs of us__hop_snake take every tile once between them, and the
     dK/dV kernel's walk (us__hop_kwalk) every key block once, each with its ring place; the
     block kernels' walk (us__hop_block_walk) every query tile once, those that see no key apart;
   - dK/dV's key blocks: blocks 0..U−1 (U = key blocks × NKV × B, walked by us__hop_snake as the
     query tiles) name every (key block, kv head, batch) once; within a band key block 0 (the
     heaviest) first.
   - the dK/dV kernel's K and V in registers (us__hop_lda): each A fragment holds the elements
     the PTX layout names.
   The same bits on the GPU whatever the order is test_cuda's part (attn_grid_same). */
#include <algorithm>
#include <vector>

#include "us_cuda_emu.h"
#include "band_order_emu.h" /* made by extract_band.py */
#include "../us_test.h"

/* the forward / dQ order at (B, T in query blocks nqb, NH, NKV) in bands of P pairs: 1 if every
   property holds (each failure is also reported) */
static int check_qtiles(int B, int nqb, int NH, int NKV, int P) {
    const int BR = 128, grp = NH / NKV, pairs = B * NKV, U = nqb * NH * B;
    std::vector<int> seen((size_t)U, 0);
    int ok = 1, u;
    for (u = 0; u < U; u++) {
        const us__hop_qtile q = us__hop_qtile_of(u, nqb, BR, NH, B, NKV, P);
        const int qb = q.q0 / BR, pair = q.b * NKV + q.g, band = u / (P * grp * nqb);
        ok &= q.q0 % BR == 0 && qb >= 0 && qb < nqb && q.h >= 0 && q.h < NH && q.b >= 0 &&
              q.b < B && q.g == q.h / grp;
        if (!ok) break;
        seen[((size_t)q.b * NH + q.h) * nqb + qb]++;
        ok &= pair / P == band; /* the band's pairs */
        if (u > 0 && (u - 1) / (P * grp * nqb) == band) {
            const us__hop_qtile p = us__hop_qtile_of(u - 1, nqb, BR, NH, B, NKV, P);
            ok &= p.q0 >= q.q0; /* longest first within the band */
            /* a group's heads consecutive: the next tile of a group's head h (h not the last of
               its group) is its head h + 1 */
            if (p.h % grp != grp - 1) ok &= q.h == p.h + 1 && q.b == p.b && q.q0 == p.q0;
        }
        if (P == pairs) { /* one band: the order before bands */
            const int r = u % (NH * B);
            ok &= q.h == r % NH && q.b == r / NH && qb == nqb - 1 - u / (NH * B);
        }
    }
    for (u = 0; ok && u < U; u++) ok &= seen[(size_t)u] == 1;
    CHECK(ok, "query tiles B%d nqb%d %d/%d, bands of %d: each once, in order", B, nqb, NH, NKV, P);
    return ok;
}

/* every tile once among the G CTAs of the persistent walk (us__hop_snake) */
static void check_walk(int U, int G) {
    std::vector<int> seen((size_t)U, 0);
    int ok = 1;
    for (int i = 0; i < G; i++)
        for (int j = 0;; j++) {
            const int u = us__hop_snake(i, j, G);
            if (u >= U) break;
            seen[(size_t)u]++;
        }
    for (int u = 0; u < U; u++) ok &= seen[(size_t)u] == 1;
    CHECK(ok, "walk of %d tiles on %d CTAs: each once", U, G);
}

/* dK/dV's key blocks 0..U−1 of the pairs p0 .. p0 + np − 1 (of B·NKV): those pairs' blocks
   each once, no other pair's */
static int check_kblocks(int B, int nkb, int NKV, int P, int p0, int np) {
    const int U = np * nkb;
    std::vector<int> seen((size_t)B * NKV * nkb, 0);
    int ok = 1, prev_band = -1, prev_kb = 0;
    for (int u = 0; ok && u < U; u++) {
        const us__hop_kblock k = us__hop_kblock_of(u, NKV, p0, np, nkb, P);
        const int band = u / (P * nkb), pair = k.b * NKV + k.g;
        ok &= k.g >= 0 && k.g < NKV && k.b >= 0 && k.b < B && k.kb >= 0 && k.kb < nkb;
        if (!ok) break;
        seen[(size_t)pair * nkb + k.kb]++;
        ok &= pair >= p0 && pair < p0 + np && (pair - p0) / P == band; /* the band's pairs */
        ok &= band != prev_band || k.kb >= prev_kb; /* heaviest first within it */
        ok &= band == prev_band || k.kb == 0;       /* a band starts at key block 0 */
        prev_band = band;
        prev_kb = k.kb;
    }
    for (size_t i = 0; ok && i < seen.size(); i++) {
        const int pair = (int)(i / (size_t)nkb);
        ok &= seen[i] == (pair >= p0 && pair < p0 + np);
    }
    CHECK(ok, "key blocks B%d nkb%d NKV%d, pairs %d.. (%d), bands of %d: each once, in order", B,
          nkb, NKV, p0, np, P);
    return ok;
}

/* the dK/dV kernel's walk (us__hop_kwalk) on G CTAs, key blocks of 128 and query tiles of BQ:
   every key block once among them; on each CTA, qb0 the block's first query tile, per the tiles
   from there, j counting the CTA's blocks, base the sum of grp·per before it, last on its final
   block only */
template <int BQ>
static void check_kwalk(int B, int nkb, int NKV, int grp, int P, int G) {
    const int T = nkb * 128 - 5, nqt = (T + BQ - 1) / BQ;
    std::vector<int> seen((size_t)B * NKV * nkb, 0);
    int ok = 1;
    emu_gdim = {(unsigned)G, 1, 1};
    for (int i = 0; i < G; i++) {
        int j = 0, base = 0, ended = 0;
        emu_bix = {(unsigned)i, 0, 0};
        us__hop_kwalk<128, BQ>(
            T, NKV, 0, B * NKV, grp, P, [&](const us__hop_kblock &kb, const us__hop_kstep &w) {
                ok &= kb.g >= 0 && kb.g < NKV && kb.b >= 0 && kb.b < B && kb.kb >= 0 && kb.kb < nkb;
                if (!ok) return;
                seen[((size_t)kb.b * NKV + kb.g) * nkb + kb.kb]++;
                ok &= !ended && w.j == j && w.base == base && w.qb0 == kb.kb * 128 / BQ &&
                      w.per == nqt - w.qb0;
                ended = w.last;
                base += grp * w.per;
                j++;
            });
        ok &= ended || j == 0;
    }
    for (size_t i = 0; ok && i < seen.size(); i++) ok &= seen[i] == 1;
    CHECK(ok,
          "dK/dV walk B%d nkb%d NKV%d grp%d BQ%d, bands of %d, %d CTAs: each block once, its place "
          "right",
          B, nkb, NKV, grp, BQ, P, G);
}

/* The block kernels' walk (us__hop_block_walk) on G CTAs over query tiles of 128 rows, from a
   table cnt [nqb][CS] of how many key tiles each sees (zero for about a third, as in ring
   attention's blocks): every (query tile, head, batch) once among the CTAs, through tile() with
   its n when n > 0, else through empty(); on each CTA the rings count only the first kind (j in
   order, base the sum of n before it), and last marks its final tile with work only. */
static void check_block_walk(int B, int nqb, int NH, int NKV, int P, int G, unsigned seed) {
    constexpr int BR = 128, CS = 3;
    std::vector<int> cnt((size_t)nqb * CS, 0), seen((size_t)B * NH * nqb, 0);
    for (int t = 0; t < nqb; t++) {
        seed = seed * 1103515245u + 12345u;
        cnt[(size_t)t * CS] = (seed >> 16) % 3 == 0 ? 0 : 1 + (int)((seed >> 8) % 40);
    }
    const int U = nqb * NH * B;
    int ok = 1;
    emu_gdim = {(unsigned)G, 1, 1};
    for (int i = 0; i < G; i++) {
        int j = 0, base = 0, ended = 0;
        emu_bix = {(unsigned)i, 0, 0};
        const auto mark = [&](const us__hop_qtile &q) {
            const int qb = q.q0 / BR;
            ok &= q.q0 % BR == 0 && qb >= 0 && qb < nqb && q.h >= 0 && q.h < NH && q.b >= 0 &&
                  q.b < B;
            if (ok) seen[((size_t)q.b * NH + q.h) * nqb + qb]++;
            return ok ? cnt[(size_t)qb * CS] : -1;
        };
        us__hop_block_walk<BR, CS>(
            cnt.data(), nqb, U, G, B, NH, NKV, P,
            [&](const us__hop_qtile &q, int n, const us__hop_ring &rg) {
                ok &= mark(q) == n && n > 0 && !ended && rg.j == j && rg.base == base;
                ended = rg.last;
                base += n;
                j++;
            },
            [&](const us__hop_qtile &q) { ok &= mark(q) == 0; });
        ok &= ended || j == 0;
    }
    for (size_t i = 0; ok && i < seen.size(); i++) ok &= seen[i] == 1;
    CHECK(ok,
          "block walk B%d nqb%d %d/%d, bands of %d, %d CTAs: each tile once, empty ones apart, "
          "its ring place right",
          B, nqb, NH, NKV, P, G);
}

/* us__hop_lda: the A fragments of k-step kk of rows r0.. of a ROWS × 128 tile laid out as the
   copy engine writes it (64-column blocks of 128-byte rows, 16-byte chunk c of row r at c ⊕ r%8),
   against the A layout of mma.m16n8k16 (PTX ISA), which wgmma's register A repeats per warp w
   over rows 16w..16w+15: register i holds row g + 8·(i%2), columns 2t + 8·(i/2) and the next
   (g = lane/4, t = lane%4), the first in its low half. Each element carries its own (row, col). */
template <int ROWS>
static void check_lda(int r0) {
    std::vector<uint16_t> tile((size_t)ROWS * 128);
    for (int r = 0; r < ROWS; r++)
        for (int col = 0; col < 128; col++) {
            const size_t at = (size_t)(col / 64) * ROWS * 64 + r * 64 +
                              ((((col % 64) / 8) ^ (r % 8)) * 8) + col % 8;
            tile[at] = (uint16_t)(r * 128 + col);
        }
    int bad = 0;
    emu_launch({1, 1, 1}, 0, [&]() {
        const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane / 4, t = lane % 4;
        for (int kk = 0; kk < 8; kk++) {
            uint32_t a[4];
            us__hop_lda<ROWS>(a, (const unsigned char *)tile.data(), r0, kk, warp, lane);
            for (int i = 0; i < 4; i++) {
                const int row = r0 + 16 * warp + g + 8 * (i % 2),
                          col = 16 * kk + 2 * t + 8 * (i / 2);
                const uint32_t want = (uint32_t)(row * 128 + col) | (uint32_t)(row * 128 + col + 1)
                                                                        << 16;
                bad += a[i] != want;
            }
        }
    });
    CHECK(bad == 0,
          "K/V A fragments, %d-row tile from row %d: every register its two elements (%d "
          "wrong)",
          ROWS, r0, bad);
}

/* Where the backward through memory keeps dS (us__hop_ds_off): the dK/dV kernel writes the blob
   of key block kb (128 keys) and query tile qb of BQ, for qb from its walk's qb0 = kb·128/BQ to
   the last, at us__hop_ds_off(kb) + qb − qb0 (the dQ kernel reads them at the same place, its
   128-row tile i against key blocks 0..i). Every blob in its own slot of [0, us__hop_ds_off(nkb)),
   none left empty */
template <int BQ>
static void check_ds_slots(int T) {
    constexpr int R = 128 / BQ;
    const int nqt = (T + BQ - 1) / BQ, nkb = (T + 127) / 128;
    const int64_t total = us__hop_ds_off(nkb, nqt, R);
    std::vector<int> seen(total > 0 ? (size_t)total : 0, 0);
    int ok = total > 0;
    for (int kb = 0; ok && kb < nkb; kb++)
        for (int qb = kb * 128 / BQ; ok && qb < nqt; qb++) {
            const int64_t slot = us__hop_ds_off(kb, nqt, R) + qb - kb * 128 / BQ;
            ok &= slot >= 0 && slot < total;
            if (ok) seen[(size_t)slot]++;
        }
    for (size_t i = 0; ok && i < seen.size(); i++) ok &= seen[i] == 1;
    CHECK(ok, "dS through memory, T %d, BQ %d: %lld blobs, each its own slot", T, BQ,
          (long long)total);
}

/* A dS blob's parts (us__hop_ds_part): every (dK/dV consumer c, warp w, k-step t, lane) its own
   16 bytes of the BQ·256, and at the place the kernels ran on the GPU in the sixteenth session
   before the layout had a name: the writer c·BQ·8 + w·BQ·2 + 32t + lane units, the dQ kernel's
   consumer (query k-step t of its tile, key k-step kk) at byte (t·512 + 16·lane) + kk·(BQ/16)·512 */
template <int BQ>
static void check_ds_parts(void) {
    std::vector<int> seen((size_t)BQ * 16, 0);
    int ok = 1;
    for (int c = 0; c < 2; c++)
        for (int w = 0; w < 4; w++)
            for (int t = 0; t < BQ / 16; t++)
                for (int l = 0; l < 32; l++) {
                    const int u = us__hop_ds_part<BQ>(c, w, 0) + us__hop_ds_part<BQ>(0, 0, t) + l;
                    ok &= u >= 0 && u < BQ * 16 && u == c * BQ * 8 + w * BQ * 2 + 32 * t + l;
                    if (u >= 0 && u < BQ * 16) seen[(size_t)u]++;
                    const int kk = 4 * c + w; /* the dQ kernel's key k-step */
                    ok &= 16 * (us__hop_ds_part<BQ>(0, 0, t) + l) +
                              16 * us__hop_ds_part<BQ>(kk >> 2, kk & 3, 0) ==
                          t * 512 + 16 * l + kk * (BQ / 16) * 512;
                }
    for (int v : seen) ok &= v == 1;
    CHECK(ok, "dS blob of BQ %d: every part its own 16 bytes, where the kernels put them", BQ);
}

/* The host side's choices, over shapes from one pair to thousands: the band of pairs (1 ≤ P ≤
   pairs, all of them in one band when asked, 1 where there are none: the chunk of zero pairs
   that divided by zero on the GPU in the sixteenth session) and the chunk of the backward
   through memory (none at HS 64, 80 by default, at HS > 128, or when the two kernels or the
   fused one are asked for; else at most the call's pairs, at most 65535 heads, and by default
   a chunk's dS within 1/32 of the GPU's memory, none where one pair's is more) */
static void check_host_rules(void) {
    int bad = 0, n = 0;
    for (int64_t pairs = 0; pairs <= 300; pairs++)
        for (int64_t ctas : {1, 3, 132})
            for (int asked : {-1, 0, 1, 3, 7}) {
                const int64_t P = us__hop_band_of(pairs, ctas, asked);
                bad += pairs < 1 ? P != 1 : P < 1 || P > pairs || (asked < 0 && P != pairs);
                n++;
            }
    const size_t GB = (size_t)1 << 30;
    for (int HS : {64, 80, 96, 128, 192, 256})
        for (int mode : {0, 4, 5, 7})
            for (int asked : {0, 1, 3})
                for (size_t mem : {(size_t)0, 80 * GB, 141 * GB})
                    for (int64_t T : {1, 100, 4096, 32768, 65536, 262144})
                        for (int64_t B : {1, 2, 16, 4096})
                            for (int NKV : {1, 8, 16}) {
                                const int NH = NKV == 1 ? 32 : 2 * NKV, grp = NH / NKV;
                                const int np = us__hop_ds_chunk(HS, mode, asked, mem, B * NKV, grp,
                                                                us__hop_ds_bytes(1, T, grp, HS));
                                /* the block backward's rule, its query block half as long */
                                const int64_t Tq = (T + 1) / 2;
                                const int npb =
                                    us__hop_ds_chunk(HS, mode, asked, mem, B * NKV, grp,
                                                     us__hop_block_ds_bytes(1, Tq, T, grp, HS));
                                const bool off = HS > 128 || mode == 4 || mode == 5 ||
                                                 (mode != 7 && HS != 96 && HS != 128);
                                int ok = np >= 0 && np <= B * NKV && (int64_t)np * grp <= 65535;
                                if (off) ok &= np == 0;
                                if (!off && asked > 0)
                                    ok &= np == (asked < B * NKV ? asked : B * NKV);
                                if (!off && asked == 0) {
                                    const size_t one = us__hop_ds_bytes(1, T, grp, HS);
                                    ok &= np == 0 ? one > mem / 32 || mem == 0
                                                  : us__hop_ds_bytes(np, T, grp, HS) <= mem / 32;
                                    const size_t oneb = us__hop_block_ds_bytes(1, Tq, T, grp, HS);
                                    ok &= npb == 0 ? oneb > mem / 32 || mem == 0
                                                   : us__hop_block_ds_bytes(npb, Tq, T, grp, HS) <=
                                                         mem / 32;
                                }
                                ok &= npb >= 0 && npb <= B * NKV && (int64_t)npb * grp <= 65535;
                                if (off) ok &= npb == 0;
                                if (!off && asked > 0)
                                    ok &= npb == (asked < B * NKV ? asked : B * NKV);
                                bad += !ok;
                                n++;
                            }
    CHECK(bad == 0, "host rules: band of pairs and dS chunk at %d settings (%d wrong)", n, bad);
}

int main(void) {
    check_host_rules();
    check_ds_parts<64>();
    check_ds_parts<128>();
    for (int T : {1, 64, 127, 128, 129, 1000, 4096}) {
        check_ds_slots<64>(T);
        check_ds_slots<128>(T);
    }
    check_lda<64>(0);
    check_lda<128>(0);
    check_lda<128>(64);
    /* B, query/key blocks, NH, NKV: multi-head, GQA, MQA; pair counts prime and composite */
    static const int shapes[][4] = {{8, 16, 16, 16}, {4, 32, 32, 8}, {16, 8, 16, 4}, {3, 5, 8, 1},
                                    {1, 64, 16, 4},  {7, 3, 6, 3},   {2, 1, 4, 4},   {5, 9, 12, 2}};
    for (const auto &s : shapes) {
        const int pairs = s[0] * s[3];
        for (int P = 1; P <= pairs; P++)
            if (!check_qtiles(s[0], s[1], s[2], s[3], P) ||
                !check_kblocks(s[0], s[1], s[3], P, 0, pairs))
                break;
        /* a chunk of the pairs (the backward with dS through memory): the middle third */
        if (pairs >= 3) check_kblocks(s[0], s[1], s[3], (pairs / 3 + 1) / 2, pairs / 3, pairs / 3);
        for (int G : {1, 3, 132}) {
            check_walk(s[1] * s[2] * s[0], G);
            check_kwalk<64>(s[0], s[1], s[3], s[2] / s[3], pairs, G);
            check_kwalk<128>(s[0], s[1], s[3], s[2] / s[3], (pairs + 1) / 2, G);
            check_block_walk(s[0], s[1], s[2], s[3], (pairs + 1) / 2, G, 7u + (unsigned)G);
        }
    }
    return us_test_done("band_emu");
}
