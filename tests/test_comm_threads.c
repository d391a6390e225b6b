/* test_comm_threads.c — the threads backend of the comm seam (ultrascale_comm.h).
   Every collective is checked against a serial reference computed on the main thread after
   the launch, bit for bit: the reference combines in the backend's documented order (chunk c
   of a ring reduction starts at group rank c+1; reduce starts at the root), so f32, f64, bf16
   and i32 all compare exactly, no tolerance. Then asynchronous progress, concurrent groups
   (rows and columns, a 2x2x2 mesh), tracing, determinism across launches, bytes_sent, and the
   failure paths: a failing rank, a sleeping rank, a rank that leaves early, bad arguments.
   Rank threads record checks through RCHECK (CHECK under a mutex). */
#define _POSIX_C_SOURCE 200809L
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"
#include "../ultrascale_comm.h"
#include "us_test.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static pthread_mutex_t tmu = PTHREAD_MUTEX_INITIALIZER;
#define RCHECK(cond, ...)           \
    do {                            \
        int ok_ = (cond);           \
        pthread_mutex_lock(&tmu);   \
        CHECK(ok_, __VA_ARGS__);    \
        pthread_mutex_unlock(&tmu); \
    } while (0)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_s(double s) {
    struct timespec ts;
    ts.tv_sec = (time_t)s;
    ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
    nanosleep(&ts, NULL);
}

/* ---------------------------------------------------------------- data and the serial reference */
/* Element i of rank r's buffer number `seed`: a hash, so any thread can regenerate it. */
static double gen(uint64_t seed, int r, int64_t i) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + (uint64_t)r * 0xBF58476D1CE4E5B9ull +
                 (uint64_t)i * 0x94D049BB133111EBull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) * (2.0 / 9007199254740992.0) - 1.0; /* [-1, 1) */
}

static void fill(void *p, us_dtype dt, int64_t n, uint64_t seed, int r) {
    int64_t i;
    for (i = 0; i < n; i++) {
        double v = gen(seed, r, i);
        switch (dt) {
        case US_F32:
            ((float *)p)[i] = (float)(v * 3.7);
            break;
        case US_F64:
            ((double *)p)[i] = v * 3.7;
            break;
        case US_I32:
            ((int32_t *)p)[i] = (int32_t)(v * 1000.0);
            break;
        case US_BF16:
            ((uint16_t *)p)[i] = us_f32_to_bf16((float)(v * 3.7));
            break;
        default:
            ((uint8_t *)p)[i] = (uint8_t)(v * 100.0 + 100.0);
            break;
        }
    }
}

/* acc ⊕= x for one element, in the dtype (bf16: add in fp32, round once) */
static void ref_op(us_dtype dt, us_reduce_op op, void *acc, const void *x) {
    int mx = op == US_REDUCE_MAX;
    switch (dt) {
    case US_F32: {
        float a = *(float *)acc, b = *(const float *)x;
        *(float *)acc = mx ? (a > b ? a : b) : a + b;
        break;
    }
    case US_F64: {
        double a = *(double *)acc, b = *(const double *)x;
        *(double *)acc = mx ? (a > b ? a : b) : a + b;
        break;
    }
    case US_I32: {
        int32_t a = *(int32_t *)acc, b = *(const int32_t *)x;
        *(int32_t *)acc = mx ? (a > b ? a : b) : a + b;
        break;
    }
    case US_BF16: {
        uint16_t ha = *(uint16_t *)acc, hb = *(const uint16_t *)x;
        float a = us_bf16_to_f32(ha), b = us_bf16_to_f32(hb);
        *(uint16_t *)acc = mx ? (a > b ? ha : hb) : us_f32_to_bf16(a + b);
        break;
    }
    default:
        break;
    }
}

static void ref_div(us_dtype dt, void *acc, int N) {
    switch (dt) {
    case US_F32:
        *(float *)acc = *(float *)acc / (float)N;
        break;
    case US_F64:
        *(double *)acc = *(double *)acc / (double)N;
        break;
    case US_I32:
        *(int32_t *)acc = *(int32_t *)acc / N;
        break;
    case US_BF16:
        *(uint16_t *)acc = us_f32_to_bf16(us_bf16_to_f32(*(uint16_t *)acc) / (float)N);
        break;
    default:
        break;
    }
}

/* out[i] = x[first][i] ⊕ x[first+1][i] ⊕ ... ⊕ x[first-1][i], left to right (indices mod N) */
static void ref_reduce(void *out, void *const *x, int64_t off, int64_t n, int N, int first,
                       us_dtype dt, us_reduce_op op) {
    size_t es = us_dtype_size(dt);
    int64_t i;
    int j;
    for (i = 0; i < n; i++) {
        char *o = (char *)out + (size_t)i * es;
        memcpy(o, (char *)x[first % N] + (size_t)(off + i) * es, es);
        for (j = 1; j < N; j++)
            ref_op(dt, op, o, (char *)x[(first + j) % N] + (size_t)(off + i) * es);
        if (op == US_REDUCE_AVG) ref_div(dt, o, N);
    }
}

static int64_t chunk_len(int64_t K, int N, int c) { return K / N + (c < K % N); }

static int64_t chunk_off(int64_t K, int N, int c) {
    int64_t o = 0;
    int k;
    for (k = 0; k < c; k++) o += chunk_len(K, N, k);
    return o;
}

static int64_t a2a_count(int from, int to, int64_t n) {
    return (int64_t)((from * 3 + to * 5 + (int)(n % 7)) % 4) * (1 + n / 200);
}

/* ---------------------------------------------------------------- every collective, one launch per case */
enum { O_AR, O_RS, O_RSI, O_AG, O_AGI, O_RED, O_GAT, O_SCA, O_BC, O_A2A, O_RING, O_N };

static const char *const onames[O_N] = {"all_reduce",
                                        "reduce_scatter",
                                        "reduce_scatter in place",
                                        "all_gather",
                                        "all_gather in place",
                                        "reduce",
                                        "gather",
                                        "scatter",
                                        "broadcast",
                                        "all_to_all",
                                        "send/recv ring"};

typedef struct suite {
    int N, root, moves; /* moves: also run the data-movement collectives */
    int64_t n;
    us_dtype dt;
    us_reduce_op op;
    uint64_t seed;
    void *out[O_N][8];     /* what each rank ended with */
    int64_t bytes[O_N][8]; /* bytes_sent each collective added */
    us_result res[O_N][8];
} suite;

static int64_t a2a_layout(int r, int N, int64_t n, int64_t *rc, int64_t *rd, int64_t *sc,
                          int64_t *sd, int64_t *send_total) {
    int64_t s = 0, d = 0;
    int j;
    for (j = 0; j < N; j++) {
        sc[j] = a2a_count(r, j, n);
        sd[j] = s;
        s += sc[j];
    }
    for (j = N - 1; j >= 0; j--) {
        rc[j] = a2a_count(j, r, n);
        rd[j] = d + 1;
        d += rc[j] + 1;
    } /* reverse order, a gap before each */
    *send_total = s;
    return d + 1; /* receive buffer elements, with a gap at the end */
}

static us_result rank_suite(us_comm *c, void *arg) {
    suite *S = (suite *)arg;
    int r = c->world.rank, N = c->world.size, k;
    size_t es = us_dtype_size(S->dt);
    int64_t n = S->n, b0;
    us_group *g = &c->world;
    char *a = (char *)malloc((size_t)N * (size_t)n * es + 64),
         *b = (char *)malloc((size_t)N * (size_t)n * es + 64);
#define RUN(O, CALL) \
    (b0 = c->bytes_sent, S->res[O][r] = (CALL), S->bytes[O][r] = c->bytes_sent - b0)
    fill(a, S->dt, n, S->seed, r);
    RUN(O_AR, c->all_reduce(c, g, a, n, S->dt, S->op, NULL));
    memcpy(S->out[O_AR][r], a, (size_t)n * es);

    fill(a, S->dt, N * n, S->seed + 1, r);
    RUN(O_RS, c->reduce_scatter(c, g, b, a, n, S->dt, S->op, NULL));
    memcpy(S->out[O_RS][r], b, (size_t)n * es);
    RUN(O_RSI, c->reduce_scatter(c, g, a + (size_t)r * n * es, a, n, S->dt, S->op, NULL));
    memcpy(S->out[O_RSI][r], a + (size_t)r * n * es, (size_t)n * es);

    fill(a, S->dt, n, S->seed + 2, r);
    memcpy(b, a, (size_t)n * es);
    RUN(O_RED, c->reduce(c, g, r == S->root ? b : NULL, b, n, S->dt, S->op, S->root,
                         NULL)); /* dst == src on the root */
    memcpy(S->out[O_RED][r], b, (size_t)n * es);

    if (S->moves) {
        fill(a, S->dt, n, S->seed + 3, r);
        RUN(O_AG, c->all_gather(c, g, b, a, n, S->dt, NULL));
        memcpy(S->out[O_AG][r], b, (size_t)N * n * es);
        memset(b, 0, (size_t)N * n * es);
        memcpy(b + (size_t)r * n * es, a, (size_t)n * es);
        RUN(O_AGI, c->all_gather(c, g, b, b + (size_t)r * n * es, n, S->dt, NULL));
        memcpy(S->out[O_AGI][r], b, (size_t)N * n * es);

        memset(b, 0, (size_t)N * n * es);
        RUN(O_GAT, c->gather(c, g, r == S->root ? b : NULL, a, n, S->dt, S->root, NULL));
        memcpy(S->out[O_GAT][r], b, (size_t)N * n * es);

        fill(a, S->dt, N * n, S->seed + 4, r);
        RUN(O_SCA, c->scatter(c, g, b, r == S->root ? a : NULL, n, S->dt, S->root, NULL));
        memcpy(S->out[O_SCA][r], b, (size_t)n * es);

        fill(a, S->dt, n, S->seed + 5, r);
        RUN(O_BC, c->broadcast(c, g, a, n, S->dt, S->root, NULL));
        memcpy(S->out[O_BC][r], a, (size_t)n * es);

        { /* all_to_all with uneven per-peer counts, receive blocks in reverse order with gaps */
            int64_t rc[8], rd[8], sc[8], sd[8], st, rt = a2a_layout(r, N, n, rc, rd, sc, sd, &st);
            char *src = (char *)malloc((size_t)(st + 1) * es), *dst = (char *)S->out[O_A2A][r];
            fill(src, S->dt, st, S->seed + 6, r);
            memset(dst, 0x5A, (size_t)rt * es);
            RUN(O_A2A, c->all_to_all(c, g, dst, rc, rd, src, sc, sd, S->dt, NULL));
            free(src);
        }
        { /* ring exchange: send right, receive from the left, both in flight, waited in reverse */
            us_work *ws = NULL, *wr = NULL;
            us_result rs, rr;
            fill(a, S->dt, n, S->seed + 7, r);
            b0 = c->bytes_sent;
            rs = c->send(c, g, a, n, S->dt, (r + 1) % N, &ws);
            rr = c->recv(c, g, b, n, S->dt, (r + N - 1) % N, &wr);
            if (rr == US_OK) rr = c->wait(c, wr);
            if (rs == US_OK) rs = c->wait(c, ws);
            S->res[O_RING][r] = rs != US_OK ? rs : rr;
            S->bytes[O_RING][r] = c->bytes_sent - b0;
            memcpy(S->out[O_RING][r], b, (size_t)n * es);
        }
    }
#undef RUN
    for (k = 0; k < O_N; k++)
        if (S->res[k][r] != US_OK) {
            free(a);
            free(b);
            return S->res[k][r];
        }
    free(a);
    free(b);
    return US_OK;
}

static int check_suite(int N, int64_t n, us_dtype dt, us_reduce_op op, int moves) {
    suite S;
    size_t es = us_dtype_size(dt), big = (size_t)(N * n + 8 * n + 64) * es + 256;
    char err[256], *ref = (char *)malloc(big), *tmp = (char *)malloc(big);
    void *x[8];
    int r, k, j, fails = 0, ok[O_N];
    us_result lr;
    const char *opn = op == US_REDUCE_SUM ? "sum" : op == US_REDUCE_AVG ? "avg" : "max";
    memset(&S, 0, sizeof S);
    S.N = N;
    S.n = n;
    S.dt = dt;
    S.op = op;
    S.moves = moves;
    S.root = N - 1 - (int)(n % N) % N;
    S.seed = (uint64_t)(N * 1000 + n) * 7 + (uint64_t)dt;
    if (N > 1 && S.root == 0) S.root = 1;
    for (k = 0; k < O_N; k++)
        for (r = 0; r < N; r++) S.out[k][r] = calloc(1, big);
    for (r = 0; r < N; r++) x[r] = malloc(big);
    lr = us_launch_ex(N, rank_suite, &S, NULL, NULL, err, sizeof err);
    CHECK(lr == US_OK, "N=%d n=%lld %s %s: launch: %s", N, (long long)n, us_dtype_name(dt), opn,
          lr == US_OK ? "ok" : err);
    for (k = 0; k < O_N; k++) ok[k] = 1;
    for (r = 0; r < N; r++) {
        /* all_reduce: chunk c combined from rank c+1 around the ring */
        for (j = 0; j < N; j++) fill(x[j], dt, n, S.seed, j);
        for (k = 0; k < N; k++)
            ref_reduce(ref + (size_t)chunk_off(n, N, k) * es, x, chunk_off(n, N, k),
                       chunk_len(n, N, k), N, k + 1, dt, op);
        if (memcmp(S.out[O_AR][r], ref, (size_t)n * es)) ok[O_AR] = 0;
        if (S.bytes[O_AR][r] !=
            (2 * n - chunk_len(n, N, r) - chunk_len(n, N, (r + 1) % N)) * (int64_t)es)
            ok[O_AR] = 0;
        /* reduce_scatter: block r combined from rank r+1 */
        for (j = 0; j < N; j++) fill(x[j], dt, N * n, S.seed + 1, j);
        ref_reduce(ref, x, (int64_t)r * n, n, N, r + 1, dt, op);
        if (memcmp(S.out[O_RS][r], ref, (size_t)n * es) ||
            S.bytes[O_RS][r] != (N - 1) * n * (int64_t)es)
            ok[O_RS] = 0;
        if (memcmp(S.out[O_RSI][r], ref, (size_t)n * es)) ok[O_RSI] = 0;
        /* reduce: from the root around */
        if (r == S.root) {
            for (j = 0; j < N; j++) fill(x[j], dt, n, S.seed + 2, j);
            ref_reduce(ref, x, 0, n, N, S.root, dt, op);
            if (memcmp(S.out[O_RED][r], ref, (size_t)n * es) || S.bytes[O_RED][r] != 0)
                ok[O_RED] = 0;
        } else if (S.bytes[O_RED][r] != n * (int64_t)es)
            ok[O_RED] = 0;
        if (!moves) continue;
        for (j = 0; j < N; j++) fill(ref + (size_t)j * n * es, dt, n, S.seed + 3, j);
        if (memcmp(S.out[O_AG][r], ref, (size_t)N * n * es) ||
            S.bytes[O_AG][r] != (N - 1) * n * (int64_t)es)
            ok[O_AG] = 0;
        if (memcmp(S.out[O_AGI][r], ref, (size_t)N * n * es)) ok[O_AGI] = 0;
        if (r == S.root && memcmp(S.out[O_GAT][r], ref, (size_t)N * n * es)) ok[O_GAT] = 0;
        if (S.bytes[O_GAT][r] != (r == S.root ? 0 : n * (int64_t)es)) ok[O_GAT] = 0;
        fill(tmp, dt, N * n, S.seed + 4, S.root);
        if (memcmp(S.out[O_SCA][r], tmp + (size_t)r * n * es, (size_t)n * es)) ok[O_SCA] = 0;
        if (S.bytes[O_SCA][r] != (r == S.root ? (N - 1) * n * (int64_t)es : 0)) ok[O_SCA] = 0;
        fill(tmp, dt, n, S.seed + 5, S.root);
        if (memcmp(S.out[O_BC][r], tmp, (size_t)n * es)) ok[O_BC] = 0;
        if (S.bytes[O_BC][r] != (r == S.root ? (N - 1) * n * (int64_t)es : 0)) ok[O_BC] = 0;
        {
            int64_t rc[8], rd[8], sc[8], sd[8], st, rt = a2a_layout(r, N, n, rc, rd, sc, sd, &st),
                                                    sent = 0;
            memset(ref, 0x5A, (size_t)rt * es);
            for (j = 0; j < N; j++) {
                int64_t prc[8], prd[8], psc[8], psd[8], pst;
                a2a_layout(j, N, n, prc, prd, psc, psd, &pst);
                fill(tmp, dt, pst, S.seed + 6, j);
                memcpy(ref + (size_t)rd[j] * es, tmp + (size_t)psd[r] * es, (size_t)rc[j] * es);
                if (j != r) sent += sc[j];
            }
            if (memcmp(S.out[O_A2A][r], ref, (size_t)rt * es) ||
                S.bytes[O_A2A][r] != sent * (int64_t)es)
                ok[O_A2A] = 0;
        }
        fill(tmp, dt, n, S.seed + 7, (r + N - 1) % N);
        if (memcmp(S.out[O_RING][r], tmp, (size_t)n * es) || S.bytes[O_RING][r] != n * (int64_t)es)
            ok[O_RING] = 0;
    }
    for (k = 0; k < O_N; k++) {
        if (!moves && k != O_AR && k != O_RS && k != O_RSI && k != O_RED) continue;
        if (!ok[k]) {
            fails++;
            CHECK(0,
                  "N=%d n=%lld %s %s root %d: %s matches the serial reference and its bytes_sent",
                  N, (long long)n, us_dtype_name(dt), opn, S.root, onames[k]);
        }
    }
    CHECK(!fails,
          "N=%d n=%lld %s %s root %d: every collective matches its serial reference bit for bit, "
          "bytes_sent as documented",
          N, (long long)n, us_dtype_name(dt), opn, S.root);
    for (k = 0; k < O_N; k++)
        for (r = 0; r < N; r++) free(S.out[k][r]);
    for (r = 0; r < N; r++) free(x[r]);
    free(ref);
    free(tmp);
    return fails;
}

/* ---------------------------------------------------------------- asynchronous progress */
typedef struct async_t {
    double issue_s[4], total_s[4];
} async_t;

static us_result rank_async(us_comm *c, void *arg) {
    async_t *A = (async_t *)arg;
    int r = c->world.rank, N = c->world.size, i, ok;
    int64_t K = 1 << 18;
    float *big = (float *)malloc((size_t)K * 4), *gat = (float *)malloc(4 * 64 * 4), one[64];
    int32_t v[3];
    double t0, acc = 0;
    us_work *w1 = NULL, *w2 = NULL, *w3 = NULL;
    us_result r1, r2, r3;
    for (i = 0; i < K; i++) big[i] = (float)(r + 1);
    for (i = 0; i < 64; i++) one[i] = (float)(r * 100 + i);
    v[0] = r;
    v[1] = 10 * r;
    v[2] = 7;
    /* three collectives in flight, some compute, then waited in another order */
    if (r == 1)
        sleep_s(0.1); /* rank 1 issues late: nobody's all_reduce can finish before it does */
    t0 = now_s();
    r1 = c->all_reduce(c, &c->world, big, K, US_F32, US_REDUCE_SUM, &w1);
    A->issue_s[r] = now_s() - t0;
    r2 = c->all_gather(c, &c->world, gat, one, 64, US_F32, &w2);
    r3 = c->broadcast(c, &c->world, v, 3, US_I32, 2, &w3);
    for (i = 0; i < 100000; i++) acc += (double)i * 1e-9; /* compute meanwhile */
    RCHECK(r1 == US_OK && r2 == US_OK && r3 == US_OK && w1 && w2 && w3 && acc > 0,
           "rank %d: three async collectives issued", r);
    r3 = c->wait(c, w3);
    r2 = c->wait(c, w2);
    r1 = c->wait(c, w1);
    A->total_s[r] = now_s() - t0;
    for (ok = 1, i = 0; i < K; i++)
        if (big[i] != (float)(N * (N + 1) / 2)) ok = 0;
    for (i = 0; i < 4 * 64; i++)
        if (gat[i] != (float)((i / 64) * 100 + i % 64)) ok = 0;
    RCHECK(r1 == US_OK && r2 == US_OK && r3 == US_OK && ok && v[0] == 2 && v[1] == 20 && v[2] == 7,
           "rank %d: waited in reverse order, all three correct", r);
    RCHECK(c->wait(c, NULL) == US_OK, "rank %d: wait(NULL) is a no-op", r);
    free(big);
    free(gat);
    return US_OK;
}

/* ---------------------------------------------------------------- groups: rows and columns, a mesh */
static us_result rank_groups(us_comm *c, void *arg) {
    int r = c->world.rank, i;
    us_group row, col, rev, none, self;
    int32_t a[16], b[16], e[4];
    us_work *wa = NULL, *wb = NULL;
    us_trace *tr = (us_trace *)arg;
    c->trace = &tr[r];
    RCHECK(c->split(c, &c->world, r / 2, r, &row) == US_OK && row.size == 2 && row.rank == r % 2,
           "rank %d: rows {0,1} {2,3}", r);
    RCHECK(c->split(c, &c->world, r % 2, r, &col) == US_OK && col.size == 2 && col.rank == r / 2,
           "rank %d: columns {0,2} {1,3}", r);
    RCHECK(c->split(c, &c->world, 0, -r, &rev) == US_OK && rev.size == 4 && rev.rank == 3 - r,
           "rank %d: key -rank reverses the order", r);
    RCHECK(c->split(c, &c->world, r == 2 ? 5 : -1, 0, &self) == US_OK &&
               (r == 2 ? self.size == 1 && self.rank == 0 : self.size == 0),
           "rank %d: a negative color joins no group (size %d)", r, self.size);
    RCHECK(c->split(c, &c->world, -1, 0, &none) == US_OK && none.size == 0 && none.impl == NULL,
           "rank %d: all negative", r);
    for (i = 0; i < 16; i++) {
        a[i] = r * 16 + i;
        b[i] = 1000 * r + i;
    }
    /* both row groups and then both column groups in flight at once, issued in the same order */
    RCHECK(c->all_reduce(c, &row, a, 16, US_I32, US_REDUCE_SUM, &wa) == US_OK &&
               c->all_reduce(c, &col, b, 16, US_I32, US_REDUCE_SUM, &wb) == US_OK,
           "rank %d: row and column all_reduce issued", r);
    RCHECK(c->wait(c, wb) == US_OK && c->wait(c, wa) == US_OK, "rank %d: both complete", r);
    for (i = 0; i < 16; i++) {
        int rb = r / 2 * 2, cb = r % 2;
        if (a[i] != rb * 16 + i + (rb + 1) * 16 + i || b[i] != 1000 * cb + i + 1000 * (cb + 2) + i)
            break;
    }
    RCHECK(i == 16, "rank %d: row sums and column sums", r);
    /* group rank order: gather over the reversed group puts world rank 3 first */
    e[0] = r;
    RCHECK(c->all_gather(c, &rev, b, e, 1, US_I32, NULL) == US_OK && b[0] == 3 && b[1] == 2 &&
               b[2] == 1 && b[3] == 0,
           "rank %d: group-rank order", r);
    if (r == 2)
        RCHECK(c->all_reduce(c, &self, a, 16, US_I32, US_REDUCE_MAX, NULL) == US_OK,
               "a group of one");
    RCHECK(c->barrier(c, &col) == US_OK && c->barrier(c, &c->world) == US_OK, "rank %d: barriers",
           r);
    c->group_free(c, &row);
    c->group_free(c, &col);
    c->group_free(c, &rev);
    if (r == 2) c->group_free(c, &self);
    c->group_free(c, &none);
    c->group_free(c, &c->world); /* no-ops */
    RCHECK(row.size == 0 && row.impl == NULL && c->world.size == 4,
           "rank %d: group_free empties the group and leaves the world", r);
    RCHECK(c->all_reduce(c, &row, a, 16, US_I32, US_REDUCE_SUM, NULL) == US_ERR_INVALID,
           "rank %d: a freed group is refused: %s", r, c->err);
    { /* the trace: one event per collective on the comm row */
        float *m = (float *)malloc(4 << 20);
        memset(m, 0, 4 << 20);
        RCHECK(c->all_reduce(c, &c->world, m, 1 << 20, US_F32, US_REDUCE_SUM, NULL) == US_OK,
               "rank %d: 4 MB all_reduce", r);
        free(m);
    }
    c->trace = NULL;
    return US_OK;
}

static us_result rank_mesh(us_comm *c, void *arg) {
    us_mesh m;
    int r = c->world.rank;
    int32_t v[5];
    us_result res = us_mesh_init(&m, c, 2, 2, 1, 2); /* dp 2 x pp 2 x tp 2 */
    (void)arg;
    RCHECK(res == US_OK && m.tp_g.size == 2 && m.pp_g.size == 2 && m.dp_g.size == 2 &&
               m.cp_g.size == 1 && m.dpcp_g.size == 2,
           "rank %d: a 2x2x2 mesh over the threads: %s", r, res == US_OK ? "ok" : c->err);
    if (res != US_OK) return res;
    v[0] = v[1] = v[2] = v[3] = v[4] = r;
    /* every dimension's group at once: 8 ranks, 4 disjoint groups per dimension */
    res = c->all_reduce(c, &m.tp_g, &v[0], 1, US_I32, US_REDUCE_SUM, NULL);
    if (res == US_OK) res = c->all_reduce(c, &m.pp_g, &v[1], 1, US_I32, US_REDUCE_SUM, NULL);
    if (res == US_OK) res = c->all_reduce(c, &m.dp_g, &v[2], 1, US_I32, US_REDUCE_SUM, NULL);
    if (res == US_OK) res = c->all_reduce(c, &m.cp_g, &v[3], 1, US_I32, US_REDUCE_SUM, NULL);
    if (res == US_OK) res = c->all_reduce(c, &m.dpcp_g, &v[4], 1, US_I32, US_REDUCE_MAX, NULL);
    { /* tp innermost: world rank = (dp·pp + pp_rank)·tp + tp_rank */
        int base = r - m.tp_rank;
        RCHECK(res == US_OK && m.tp_rank == r % 2 && m.pp_rank == r / 2 % 2 && m.dp_rank == r / 4 &&
                   v[0] == 2 * base + 1 && v[1] == 2 * (r - 2 * m.pp_rank) + 2 &&
                   v[2] == 2 * (r - 4 * m.dp_rank) + 4 && v[3] == r && v[4] == (r % 4) + 4,
               "rank %d: sums over tp, pp, dp, cp and max over dpcp", r);
    }
    us_mesh_free(&m, c);
    return res;
}

/* ---------------------------------------------------------------- determinism and bytes */
typedef struct det_t {
    int64_t K;
    int late;
    float *out[8];
    int64_t bytes[8];
} det_t;

static us_result rank_det(us_comm *c, void *arg) {
    det_t *D = (det_t *)arg;
    int r = c->world.rank;
    int64_t b0 = c->bytes_sent;
    us_result res;
    fill(D->out[r], US_F32, D->K, 99, r);
    if (r == D->late) sleep_s(0.02); /* a different rank arrives last in each run */
    res = c->all_reduce(c, &c->world, D->out[r], D->K, US_F32, US_REDUCE_SUM, NULL);
    D->bytes[r] = c->bytes_sent - b0;
    return res;
}

/* ---------------------------------------------------------------- failures */
typedef struct fail_t {
    int mode;
    us_result res[8];
    char err[8][256];
    double t[8];
    double later_t[8];
    us_result later[8];
    char later_err[8][256];
    float keep[8][100];
} fail_t;

enum { F_ERROR, F_SLEEP, F_LEAVE, F_RECV_LEAVE, F_UNWAITED };

static us_result rank_fail(us_comm *c, void *arg) {
    fail_t *F = (fail_t *)arg;
    int r = c->world.rank;
    float x[100] = {0};
    double t0;
    if (F->mode ==
        F_UNWAITED) { /* handles never waited: us_launch runs and frees them (the buffer outlives the rank) */
        us_work *w = NULL;
        return c->all_reduce(c, &c->world, F->keep[r], 100, US_F32, US_REDUCE_SUM, &w);
    }
    if (r == 2 && F->mode == F_ERROR) {
        snprintf(c->err, sizeof c->err, "rank two gives up");
        return US_ERR_INVALID;
    }
    if (r == 2 && (F->mode == F_LEAVE || F->mode == F_RECV_LEAVE)) return US_OK;
    if (r == 3 && F->mode == F_SLEEP) sleep_s(0.8);
    t0 = now_s();
    if (F->mode == F_RECV_LEAVE)
        F->res[r] = c->recv(c, &c->world, x, 100, US_F32, 2, NULL);
    else
        F->res[r] = c->all_reduce(c, &c->world, x, 100, US_F32, US_REDUCE_SUM, NULL);
    F->t[r] = now_s() - t0;
    memcpy(F->err[r], c->err, sizeof c->err);
    t0 = now_s();
    F->later[r] =
        c->broadcast(c, &c->world, x, 100, US_F32, 0, NULL); /* after the abort: fails at once */
    F->later_t[r] = now_s() - t0;
    memcpy(F->later_err[r], c->err, sizeof c->err);
    return F->res[r];
}

static void check_failure(int mode, const char *what, int culprit, const char *word,
                          double timeout) {
    fail_t F;
    us_launch_config cfg;
    us_result rr[4];
    char err[256];
    int r, ok = 1, later_ok = 1;
    double t0 = now_s(), total;
    us_result lr;
    memset(&F, 0, sizeof F);
    memset(&cfg, 0, sizeof cfg);
    F.mode = mode;
    cfg.timeout_s = timeout;
    lr = us_launch_ex(4, rank_fail, &F, &cfg, rr, err, sizeof err);
    total = now_s() - t0;
    for (r = 0; r < 4; r++) {
        char name[16];
        if (r == culprit) continue;
        snprintf(name, sizeof name, "rank %d", culprit);
        if (F.res[r] != US_ERR_BACKEND || !strstr(F.err[r], name) || !strstr(F.err[r], word) ||
            F.t[r] > 3 * timeout) {
            ok = 0;
            printf("    rank %d: result %d after %.2f s: %s\n", r, (int)F.res[r], F.t[r], F.err[r]);
        }
        if (F.later[r] != US_ERR_BACKEND || !strstr(F.later_err[r], name) || F.later_t[r] > 0.1)
            later_ok = 0;
    }
    CHECK(ok, "%s: every other rank's collective fails within %.1f s naming rank %d: \"%s\"", what,
          3 * timeout, culprit, F.err[culprit == 0 ? 1 : 0]);
    CHECK(later_ok, "%s: a later collective fails at once naming rank %d: \"%s\"", what, culprit,
          F.later_err[culprit == 0 ? 1 : 0]);
    CHECK(lr != US_OK && strstr(err, "rank") &&
              (mode != F_ERROR ||
               (lr == US_ERR_INVALID && rr[2] == US_ERR_INVALID && strstr(err, "rank 2"))),
          "%s: us_launch returns %d: \"%s\"", what, (int)lr, err);
    CHECK(total < 3 * timeout + (mode == F_SLEEP ? 0.8 : 0.0), "%s: the launch ends in %.2f s",
          what, total);
}

/* ---------------------------------------------------------------- invalid arguments */
static us_result rank_invalid(us_comm *c, void *arg) {
    int r = c->world.rank, i;
    float a[8] = {0}, b[32];
    int64_t cnt[4] = {1, 1, 1, 1}, dsp[4] = {0, 1, 2, 3}, bad_cnt[4] = {1, 1, 1, 1};
    us_group bad = {2, 1, NULL}, wrong = c->world;
    us_work *w = (us_work *)&c; /* poisoned: a refused call must set it to NULL */
    (void)arg;
    wrong.rank = (r + 1) % 4;
#define INV(CALL, what)                                                                            \
    do {                                                                                           \
        us_result q_ = (CALL);                                                                     \
        RCHECK(q_ == US_ERR_INVALID && c->err[0], "rank %d: %s gives US_ERR_INVALID: %s", r, what, \
               c->err);                                                                            \
        c->err[0] = 0;                                                                             \
    } while (0)
    INV(c->all_reduce(c, &c->world, a, -1, US_F32, US_REDUCE_SUM, &w), "a negative count");
    RCHECK(w == NULL, "rank %d: a refused call leaves no handle", r);
    INV(c->all_reduce(c, &bad, a, 8, US_F32, US_REDUCE_SUM, NULL), "a group of no comm");
    INV(c->all_reduce(c, &wrong, a, 8, US_F32, US_REDUCE_SUM, NULL),
        "a group where this rank is not at g->rank");
    INV(c->all_reduce(c, NULL, a, 8, US_F32, US_REDUCE_SUM, NULL), "a NULL group");
    INV(c->all_reduce(c, &c->world, a, 8, US_E4M3, US_REDUCE_SUM, NULL), "reducing FP8");
    INV(c->all_reduce(c, &c->world, a, 8, US_F32, (us_reduce_op)7, NULL), "an unknown reduce op");
    INV(c->broadcast(c, &c->world, a, 8, US_F32, 4, NULL), "root 4 of 4");
    INV(c->reduce(c, &c->world, a, a, 8, US_F32, US_REDUCE_SUM, -1, NULL), "root -1");
    INV(c->gather(c, &c->world, b, a, 2, US_F32, 9, NULL), "gather root 9");
    INV(c->scatter(c, &c->world, a, b, 2, US_F32, 4, NULL), "scatter root 4");
    INV(c->send(c, &c->world, a, 8, US_F32, 4, NULL), "send to peer 4");
    INV(c->recv(c, &c->world, a, 8, US_F32, -1, NULL), "recv from peer -1");
    INV(c->reduce_scatter(c, &c->world, a, b, -2, US_F32, US_REDUCE_SUM, NULL),
        "reduce_scatter of -2");
    INV(c->all_gather(c, &c->world, b, NULL, 2, US_F32, NULL), "a NULL buffer");
    bad_cnt[1] = -1;
    INV(c->all_to_all(c, &c->world, b, bad_cnt, dsp, a, cnt, dsp, US_F32, NULL),
        "a negative all_to_all count");
    INV(c->split(c, &bad, 0, 0, &wrong), "split of a foreign group");
    /* mismatches between ranks are found inside the collective, on every rank, without aborting */
    INV(c->all_reduce(c, &c->world, a, r == 1 ? 7 : 8, US_F32, US_REDUCE_SUM, NULL),
        "counts that differ between ranks");
    INV(c->broadcast(c, &c->world, a, 8, US_F32, r == 3 ? 1 : 0, NULL),
        "roots that differ between ranks");
    if (r == 0 || r == 1) {
        int64_t sc[4] = {1, 1, 1, 1}, rc[4] = {1, 1, 1, 1};
        if (r == 0) sc[1] = 2; /* rank 0 sends 2 to rank 1, which expects 1 */
        INV(c->all_to_all(c, &c->world, b, rc, dsp, a, sc, dsp, US_F32, NULL),
            "all_to_all counts that do not match");
    } else {
        RCHECK(c->all_to_all(c, &c->world, b, cnt, dsp, a, cnt, dsp, US_F32, NULL) == US_OK,
               "rank %d: its pairs match", r);
    }
    if (r < 2) {
        if (r == 0)
            RCHECK(c->send(c, &c->world, a, 5, US_F32, 1, NULL) == US_OK, "send 5");
        else
            INV(c->recv(c, &c->world, a, 8, US_F32, 0, NULL), "a recv of another size");
    }
    RCHECK(c->all_reduce(c, &c->world, NULL, 0, US_F32, US_REDUCE_SUM, NULL) == US_OK &&
               c->reduce_scatter(c, &c->world, NULL, NULL, 0, US_BF16, US_REDUCE_AVG, NULL) ==
                   US_OK &&
               c->all_gather(c, &c->world, NULL, NULL, 0, US_I32, NULL) == US_OK &&
               c->broadcast(c, &c->world, NULL, 0, US_F64, 3, NULL) == US_OK &&
               c->send(c, &c->world, NULL, 0, US_F32, (r + 1) % 4, NULL) == US_OK &&
               c->recv(c, &c->world, NULL, 0, US_F32, (r + 3) % 4, NULL) == US_OK,
           "rank %d: zero elements with NULL buffers are fine", r);
    { /* a copy of a group freed twice releases one reference only */
        us_group p, q;
        RCHECK(c->split(c, &c->world, r % 2, 0, &p) == US_OK, "rank %d: split for the double free",
               r);
        q = p;
        c->group_free(c, &p);
        RCHECK(c->barrier(c, &q) == US_ERR_INVALID,
               "rank %d: a copy of a freed group is refused: %s", r, c->err);
        c->group_free(c, &q);
        RCHECK(c->barrier(c, &c->world) == US_OK, "rank %d: freeing a copy again does no harm", r);
    }
    for (i = 0; i < 8; i++) a[i] = 1.0f;
    RCHECK(c->all_reduce(c, &c->world, a, 8, US_F32, US_REDUCE_SUM, NULL) == US_OK && a[7] == 4.0f,
           "rank %d: the launch goes on after argument errors", r);
#undef INV
    return US_OK;
}

/* Rendezvous sends (NCCL's behaviour): mode 0, ranks 0 and 1 exchange with sendrecv; mode 1,
   both send first and then receive, which must deadlock and time out; mode 2, the eager default
   lets the same order through. Mode 3: a send that is not waited for still holds up the rank's
   later receive on the same group (one progress thread, as one NCCL stream), so the same order
   deadlocks again. Mode 4: on channels (dup) it goes through; and rank 0 sends two messages on
   two channels that rank 1 receives in the other order, each from its own channel. */
typedef struct p2p_t {
    int mode;
    float got[2][3], got2[3];
    us_result res[2];
    double t[2];
} p2p_t;

static us_result rank_p2p(us_comm *c, void *arg) {
    p2p_t *P = (p2p_t *)arg;
    int r = c->world.rank, peer = 1 - r;
    float mine[3] = {(float)r + 1, (float)r + 2, (float)r + 3};
    double t0 = now_s();
    us_result res;
    if (P->mode == 0)
        res = c->sendrecv(c, &c->world, mine, 3, peer, P->got[r], 3, peer, US_F32, NULL);
    else if (P->mode == 3) {
        us_work *w = NULL;
        res = c->send(c, &c->world, mine, 3, US_F32, peer, &w);
        if (res == US_OK) res = c->recv(c, &c->world, P->got[r], 3, US_F32, peer, NULL);
        if (w) {
            us_result r2 = c->wait(c, w);
            if (res == US_OK) res = r2;
        }
    } else if (P->mode == 4) {
        us_group ch[2];
        us_work *w[2] = {NULL, NULL};
        float other[3] = {(float)r + 11, (float)r + 12, (float)r + 13};
        int k;
        res = c->dup(c, &c->world, &ch[0]);
        if (res == US_OK) res = c->dup(c, &c->world, &ch[1]);
        if (res != US_OK) {
            P->res[r] = res;
            return res;
        }
        if (r == 0) { /* both sends in flight at once, on two channels */
            res = c->send(c, &ch[0], mine, 3, US_F32, peer, &w[0]);
            if (res == US_OK) res = c->send(c, &ch[1], other, 3, US_F32, peer, &w[1]);
            if (res == US_OK) res = c->recv(c, &ch[0], P->got[r], 3, US_F32, peer, NULL);
        } else { /* the second channel first: its message, not the older one */
            res = c->recv(c, &ch[1], P->got[r], 3, US_F32, peer, NULL);
            if (res == US_OK) res = c->recv(c, &ch[0], P->got2, 3, US_F32, peer, NULL);
            if (res == US_OK) res = c->send(c, &ch[0], mine, 3, US_F32, peer, &w[0]);
        }
        for (k = 0; k < 2; k++)
            if (w[k]) {
                us_result r2 = c->wait(c, w[k]);
                if (res == US_OK) res = r2;
            }
        c->group_free(c, &ch[0]);
        c->group_free(c, &ch[1]);
    } else {
        res = c->send(c, &c->world, mine, 3, US_F32, peer, NULL);
        if (res == US_OK) res = c->recv(c, &c->world, P->got[r], 3, US_F32, peer, NULL);
    }
    P->res[r] = res;
    P->t[r] = now_s() - t0;
    return res;
}

static void check_p2p(void) {
    us_launch_config lc;
    p2p_t P;
    char err[256];
    us_result lr;
    int mode;
    for (mode = 0; mode < 5; mode++) {
        memset(&P, 0, sizeof P);
        memset(&lc, 0, sizeof lc);
        P.mode = mode;
        lc.timeout_s = 0.3;
        lc.p2p_rendezvous = mode != 2;
        lr = us_launch_ex(2, rank_p2p, &P, &lc, NULL, err, sizeof err);
        if (mode == 1 || mode == 3)
            CHECK(lr == US_ERR_BACKEND && P.res[0] == US_ERR_BACKEND &&
                      P.res[1] == US_ERR_BACKEND && strstr(err, "timed out") && P.t[0] < 1.5,
                  "rendezvous: both ranks sending first%s deadlock and time out in %.2f s, as on "
                  "NCCL: \"%s\"",
                  mode == 3 ? " (without waiting for the send)" : "", P.t[0], err);
        else if (mode == 4)
            CHECK(lr == US_OK && P.got[1][0] == 11 && P.got[1][2] == 13 && P.got2[0] == 1 &&
                      P.got2[2] == 3 && P.got[0][0] == 2 && P.got[0][2] == 4,
                  "channels (dup): a send in flight does not hold up a receive on another channel, "
                  "and each channel matches its own "
                  "messages (rank 1 got %g then %g): %s",
                  P.got[1][0], P.got2[0], lr == US_OK ? "ok" : err);
        else
            CHECK(lr == US_OK && P.got[0][0] == 2 && P.got[0][2] == 4 && P.got[1][0] == 1 &&
                      P.got[1][2] == 3,
                  "%s: the exchange completes with each other's values",
                  mode == 0 ? "rendezvous sendrecv" : "eager send then recv");
    }
}

/* NCCL semantics (us_launch_config.nccl): a device synchronisation at every wait. Rank 0
   posts a receive on a channel (dup), then joins an all_reduce; rank 1 joins it, then receives
   rank 0's send on the world, and only then sends on the channel. Without the semantics this
   completes; with them rank 0's all_reduce waits for its posted receive, which waits for a send
   that needs rank 0's next call: the GPU's hang, reported by the watchdog well before the
   timeout, naming both ranks. */
static us_result rank_sync(us_comm *c, void *arg) {
    float x = 1, y = 0, z = 7;
    us_group ch;
    us_work *w = NULL;
    us_result r;
    (void)arg;
    if ((r = c->dup(c, &c->world, &ch)) != US_OK) return r;
    if (c->world.rank == 0) {
        r = c->recv(c, &ch, &y, 1, US_F32, 1, &w);
        if (r == US_OK) r = c->all_reduce(c, &c->world, &x, 1, US_F32, US_REDUCE_SUM, NULL);
        if (r == US_OK) r = c->send(c, &c->world, &z, 1, US_F32, 1, NULL);
        if (w) {
            us_result r2 = c->wait(c, w);
            if (r == US_OK) r = r2;
        }
        if (r == US_OK && (x != 2 || y != 7)) r = US_ERR_BACKEND;
    } else {
        r = c->all_reduce(c, &c->world, &x, 1, US_F32, US_REDUCE_SUM, NULL);
        if (r == US_OK) r = c->recv(c, &c->world, &y, 1, US_F32, 0, NULL);
        if (r == US_OK) r = c->send(c, &ch, &y, 1, US_F32, 0, NULL);
    }
    c->group_free(c, &ch);
    return r;
}

static void check_nccl_semantics(void) {
    us_launch_config lc;
    char err[256];
    int nccl;
    for (nccl = 0; nccl < 2; nccl++) {
        double t0 = now_s(), dt;
        us_result lr;
        memset(&lc, 0, sizeof lc);
        lc.timeout_s = 20;
        lc.nccl = nccl;
        lr = us_launch_ex(2, rank_sync, NULL, &lc, NULL, err, sizeof err);
        dt = now_s() - t0;
        if (!nccl)
            CHECK(lr == US_OK,
                  "a receive posted before a collective completes without NCCL "
                  "semantics: %s",
                  lr == US_OK ? "ok" : err);
        else
            CHECK(lr == US_ERR_BACKEND && dt < 5 && strstr(err, "deadlock: every rank waits") &&
                      strstr(err, "rank 0 waits for op") &&
                      strstr(err, "recv from rank 1 (a dup)") && strstr(err, "rank 1 waits for"),
                  "NCCL semantics: the device synchronisation's deadlock is reported in %.1f s: "
                  "\"%s\"",
                  dt, err);
    }
}

/* all_to_all as expert parallelism uses it (// >>ep): uneven counts, a rank that sends nothing,
   a rank that receives nothing, on the world and on groups split from it (pairs of ranks) */
static int64_t a2a_sparse_count(int from, int to) {
    return from == 1 || to == 2 ? 0 : 1 + from + 2 * to;
}

static us_result rank_a2a_sparse(us_comm *c, void *arg) {
    int *bad = (int *)arg, r = c->world.rank, pass, j;
    us_group pair;
    if (c->split(c, &c->world, r / 2, r, &pair) != US_OK) {
        bad[r] = 1;
        return US_OK;
    }
    for (pass = 0; pass < 2; pass++) {
        us_group *g = pass ? &pair : &c->world;
        int me = g->rank, N = g->size;
        int64_t sc[8], sd[8], rc[8], rd[8], s = 0, d = 0, i;
        float a[256], b[256];
        for (j = 0; j < N; j++) {
            sc[j] = a2a_sparse_count(me, j);
            sd[j] = s;
            s += sc[j];
            rc[j] = a2a_sparse_count(j, me);
            rd[j] = d + 1;
            d += rc[j] + 1; /* a gap before each block */
        }
        for (j = 0; j < N; j++)
            for (i = 0; i < sc[j]; i++) a[sd[j] + i] = (float)(1000 * me + 100 * j + i);
        for (i = 0; i < 256; i++) b[i] = -1.0f;
        if (c->all_to_all(c, g, b, rc, rd, a, sc, sd, US_F32, NULL) != US_OK) {
            bad[r] = 1;
            break;
        }
        for (j = 0; j < N; j++) {
            for (i = 0; i < rc[j]; i++)
                if (b[rd[j] + i] != (float)(1000 * j + 100 * me + i)) bad[r] = 1;
            if (b[rd[j] - 1] != -1.0f)
                bad[r] =
                    1; /* the gaps (and a rank's whole buffer when it gets nothing) untouched */
        }
    }
    c->group_free(c, &pair);
    return US_OK;
}

int main(int argc, char **argv) {
    static const int sizes[] = {1, 2, 3, 4, 5, 8};
    static const int64_t counts[] = {1, 7, 1003};
    static const us_dtype dts[] = {US_F32, US_I32, US_F64, US_BF16};
    int si, ci, di, oi, r, fails = 0;
    double t_start = now_s();
    char err[256];
    us_result lr;
    us_test_verbose = argc > 1 && !strcmp(argv[1], "-v");

    { /* all_to_all with empty senders and receivers, on the world and on split pairs */
        int bad[4] = {0, 0, 0, 0};
        CHECK(us_launch(4, rank_a2a_sparse, bad) == US_OK && !bad[0] && !bad[1] && !bad[2] &&
                  !bad[3],
              "all_to_all where rank 1 sends nothing and rank 2 receives nothing (4 ranks, and "
              "pairs split from them)");
    }

    /* every collective against its serial reference */
    for (si = 0; si < 6; si++)
        for (ci = 0; ci < 3; ci++)
            for (di = 0; di < 4; di++)
                for (oi = 0; oi < 3; oi++)
                    fails += check_suite(sizes[si], counts[ci], dts[di], (us_reduce_op)oi, oi == 0);
    fails += check_suite(3, 0, US_F32, US_REDUCE_SUM, 1); /* zero elements */
    printf("  collectives: %d cases failed (%.2f s)\n", fails, now_s() - t_start);

    { /* async: issue returns before the collective can complete */
        async_t A;
        memset(&A, 0, sizeof A);
        lr = us_launch_ex(4, rank_async, &A, NULL, NULL, err, sizeof err);
        CHECK(lr == US_OK, "async launch: %s", lr == US_OK ? "ok" : err);
        CHECK(A.issue_s[0] < 0.05 && A.total_s[0] >= 0.09,
              "rank 0's async all_reduce returned in %.4f s, completed after %.3f s (rank 1 joined "
              "at 0.1 s)",
              A.issue_s[0], A.total_s[0]);
    }
    { /* groups, concurrent collectives, tracing */
        us_trace tr[4];
        int ok = 1;
        for (r = 0; r < 4; r++) us_trace_init(&tr[r], r);
        lr = us_launch_ex(4, rank_groups, tr, NULL, NULL, err, sizeof err);
        CHECK(lr == US_OK, "groups launch: %s", lr == US_OK ? "ok" : err);
        for (r = 0; r < 4; r++) {
            int n = tr[r].n[US_STREAM_COMM];
            const us_trace_event *e = n ? &tr[r].ev[US_STREAM_COMM][n - 1] : NULL;
            if (n < 8 || !e || strcmp(e->name, "all_reduce 4.0 MB") || e->t1 < e->t0 ||
                strcmp(e->cat, "comm") || tr[r].n[US_STREAM_COMPUTE])
                ok = 0;
            if (r == 0 && e)
                printf("  rank 0: %d comm events, last \"%s\" %.0f us\n", n, e->name,
                       e->t1 - e->t0);
        }
        CHECK(ok, "every collective recorded on the comm row, named \"all_reduce 4.0 MB\"");
        for (r = 0; r < 4; r++) us_trace_free(&tr[r]);
        lr = us_launch_ex(8, rank_mesh, NULL, NULL, NULL, err, sizeof err);
        CHECK(lr == US_OK, "mesh launch: %s", lr == US_OK ? "ok" : err);
    }
    { /* determinism: two launches, bitwise the same, and bytes_sent of the ring */
        det_t D1, D2;
        int N = 5, same = 1, bytes_ok = 1;
        D1.K = D2.K = 100003;
        D1.late = 0;
        D2.late = 3;
        for (r = 0; r < N; r++) {
            D1.out[r] = (float *)malloc((size_t)D1.K * 4);
            D2.out[r] = (float *)malloc((size_t)D1.K * 4);
        }
        us_launch(N, rank_det, &D1);
        us_launch(N, rank_det, &D2);
        for (r = 0; r < N; r++) {
            if (memcmp(D1.out[r], D2.out[r], (size_t)D1.K * 4) ||
                memcmp(D1.out[r], D1.out[0], (size_t)D1.K * 4))
                same = 0;
            if (D1.bytes[r] !=
                4 * (2 * D1.K - chunk_len(D1.K, N, r) - chunk_len(D1.K, N, (r + 1) % N)))
                bytes_ok = 0;
        }
        CHECK(same,
              "the same all_reduce twice: bitwise identical across launches and across ranks");
        CHECK(bytes_ok && D1.bytes[0] == 4 * (2 * 100003 - 20001 - 20001),
              "bytes_sent of a ring all_reduce of K=%lld f32 over %d ranks: %lld = 4·(2K - "
              "chunk(r) - chunk(r+1))",
              (long long)D1.K, N, (long long)D1.bytes[0]);
        for (r = 0; r < N; r++) {
            free(D1.out[r]);
            free(D2.out[r]);
        }
    }
    check_p2p();
    check_nccl_semantics();
    /* failures: never a hang, never a crash, the culprit named */
    check_failure(F_ERROR, "a rank returns an error", 2, "failed", 1.0);
    check_failure(F_SLEEP, "a rank sleeps past timeout_s = 0.3", 3, "timed out", 0.3);
    check_failure(F_LEAVE, "a rank returns early", 2, "exited", 1.0);
    check_failure(F_RECV_LEAVE, "a recv from a rank that returns early", 2, "exited", 1.0);
    {
        fail_t F;
        memset(&F, 0, sizeof F);
        F.mode = F_UNWAITED;
        for (r = 0; r < 3; r++) F.keep[r][99] = (float)r;
        CHECK(us_launch(3, rank_fail, &F) == US_OK && F.keep[0][99] == 3.0f &&
                  F.keep[2][99] == 3.0f,
              "handles never waited are run (to completion) and freed by us_launch");
    }
    lr = us_launch_ex(4, rank_invalid, NULL, NULL, NULL, err, sizeof err);
    CHECK(lr == US_OK, "invalid arguments: %s", lr == US_OK ? "the launch is unharmed" : err);
    CHECK(us_launch_ex(0, rank_invalid, NULL, NULL, NULL, err, sizeof err) == US_ERR_INVALID &&
              strstr(err, "nranks 0"),
          "us_launch(0): %s", err);
    {
        us_launch_config cfg;
        cfg.timeout_s = -1;
        CHECK(us_launch_ex(2, rank_invalid, NULL, &cfg, NULL, err, sizeof err) == US_ERR_INVALID &&
                  strstr(err, "timeout"),
              "negative timeout: %s", err);
    }
    { /* the state after failures is clean: a normal launch */
        det_t D;
        D.K = 1000;
        D.late = -1;
        for (r = 0; r < 3; r++) D.out[r] = (float *)malloc(4000);
        CHECK(us_launch(3, rank_det, &D) == US_OK && !memcmp(D.out[0], D.out[2], 4000),
              "a launch after the failures runs normally");
        for (r = 0; r < 3; r++) free(D.out[r]);
    }
    printf("  total %.2f s\n", now_s() - t_start);
    return us_test_done("test_comm_threads");
}
