/* ultrascale_comm.h — the comm seam's backends: ranks as threads of one process (this part),
   NCCL and the multi-process bootstrap (appended below).
   An STB-style header under the MIT licence (see ultrascale.h). It extends ultrascale.h and must
   be included after it, in the same way:
       #define _POSIX_C_SOURCE 200809L      // before the first system include (or -std=gnu99)
       #define ULTRASCALE_IMPLEMENTATION
       #include "ultrascale.h"
       #include "ultrascale_comm.h"
   and link with -pthread. Other files include both headers without the define. The two
   implementations share ultrascale.h's helpers (us__errf, the clock us__now_s), so they are
   compiled in the same file.

   TABLE OF CONTENTS (grep for the tag)
   -----------------
   public API
     threads backend ........................ us_rank_fn, us_launch_config, us_launch, us_launch_ex
     bootstrap .............................. us_dist_env_read, us_rendezvous, us_launch_procs
     NCCL backend ........................... us_nccl_init, us_nccl_free (ULTRASCALE_NCCL)
   implementation
     // >>threads     ranks as threads: per-rank progress thread, ring collectives over shared memory
     // >>bootstrap   torchrun / Open MPI / Slurm environments, TCP and file rendezvous, launcher
     // >>nccl        the comm seam over NCCL: comm stream, events, timeouts, abort, tracing

   THE THREADS BACKEND
   -------------------
   us_launch(N, fn, arg) runs fn(comm, arg) on N threads of this process, one per rank, each
   with its own us_comm: name "threads", world = {N, rank, impl}, ops = NULL (the collectives
   read and write host memory directly). It returns when every rank's fn has returned. This is
   how CI runs the exact parallel code that NCCL runs on GPUs (DESIGN.md, "the comm seam"):

       static us_result rank_main(us_comm *c, void *arg) {
           float x[1000];  ...fill x...
           return c->all_reduce(c, &c->world, x, 1000, US_F32, US_REDUCE_SUM, NULL);
       }
       char err[256]; us_launch_config cfg = {0};  cfg.timeout_s = 10;
       us_result r = us_launch_ex(8, rank_main, NULL, &cfg, NULL, err, sizeof err);
       if (r != US_OK) puts(err);     // "rank 3 failed: all_reduce on a group of 8 timed out ..."

   Every rank has one progress thread that executes that rank's collectives in issue order.
   A call with w != NULL queues the collective and returns at once with a handle; wait(c, w)
   blocks until it is done, returns its result and frees the handle. A call with w == NULL
   queues and waits, so it stays ordered after earlier asynchronous calls. Collectives on
   different groups run concurrently (rows and columns of a mesh, DP buckets beside TP), as
   long as every member issues a group's collectives in the same order. An asynchronous call's
   buffers must stay valid until its wait(); a handle never waited still runs after its rank's
   fn returned (us_launch frees it), so its buffers must not live on the rank's stack.

   Algorithms (Playbook appendix, "ring all-reduce"):
     all_reduce      ring: N-1 reduce-scatter steps then N-1 all-gather steps. The K elements
                     are cut into N chunks (chunk i holds K/N elements, one more for i < K%N).
                     In each step a rank reads the chunk its ring predecessor holds (the ranks'
                     buffers share an address space) and combines or copies it into its own;
                     a group barrier separates steps. Each chunk is reduced once, by one rank,
                     then copied around, so every rank ends with bitwise identical results.
     reduce_scatter  the same ring's first half over src (scratch: 2·n elements per rank)
     all_gather      the same ring's second half
     reduce, gather, scatter, broadcast, all_to_all
                     direct copies from the peers' published buffers
     send / recv     eager: send copies the message into a per-(sender, receiver) FIFO of the
                     group and completes without waiting for the receiver; recv takes the
                     oldest message from that peer (its count and dtype must match).
                     With us_launch_config.p2p_rendezvous, a send completes only once its
                     receiver has taken the message, as NCCL's do for large messages: an
                     order of sends and receives that deadlocks on GPUs then deadlocks (and
                     times out, naming the rank) on CPU threads too.
     sendrecv        one operation: the message is posted, the receive runs, then (rendezvous)
                     the send's completion is awaited, like NCCL's grouped send and receive

   NCCL semantics (us_launch_config.nccl): what a GPU running NCCL imposes, so that an order of
   calls that hangs there hangs here too, and is reported instead of waited out.
     - a send completes only once its receive has taken the message (p2p_rendezvous);
     - each communicator runs its operations in the order its rank issued them, and a
       point-to-point operation matches its peer's in issue order: one stream per communicator
       (a group made by dup has its own, the others share the rank's, as in the NCCL backend);
     - a send and a receive issued as one sendrecv progress together (ncclGroupStart/End);
     - the device synchronises: CUDA's implicit synchronisations (cudaFree, cudaMalloc, the first
       launch of a kernel under lazy module loading, CUDA's default since 12.2) wait for every
       stream, so for every NCCL kernel the rank has launched, pending receives included. Here
       every wait of the host (wait(), or a call with w NULL) first waits for every operation the
       rank has issued. A receive posted early whose message needs this rank's later work then
       never completes: on the GPU that is a hang the first time a kernel loads.
   A deadlock is reported instead of waited for: when every rank waits in such a synchronisation
   (or has returned) and no operation has made progress for US__THR_DEADLOCK_S seconds, the
   launch aborts with "deadlock: rank 0 waits for op 7, recv from rank 1 (a dup); ...", naming
   each rank's oldest unfinished operations.

   Reduction order (fixed, so results are the same run to run, whatever the threads' timing):
     all_reduce, reduce_scatter: chunk c of a group of N is combined in ring order starting at
       group rank c+1:  ((x[c+1] ⊕ x[c+2]) ⊕ ...) ⊕ x[c]   (indices mod N; chunk c of
       reduce_scatter is the n elements at src + c·n). A serial loop with this order
       reproduces the result bit for bit.
     reduce: starting at the root:  ((x[root] ⊕ x[root+1]) ⊕ ...) ⊕ x[root-1].
     ⊕ is + for SUM and AVG, max for MAX (a NaN wins). AVG divides the sum by N once at the end
     (I32: C integer division). US_BF16 / US_F16 buffers hold 16-bit patterns (uint16_t); each ⊕
     adds in fp32 and rounds once (us_f32_to_bf16 / us_f32_to_f16), like a bf16 / fp16 NCCL
     reduction. I32 sums wrap. Reductions take US_F32, US_F64, US_I32, US_BF16 and US_F16; copies
     take any dtype.

   bytes_sent (what this rank's peers read from it; counted when wait() sees success):
     all_reduce      (2K - len(rank) - len(rank+1))·size  (len(i) = chunk i's elements), i.e.
                     2(N-1)·K/N elements when N divides K
     reduce_scatter  (N-1)·n elements           all_gather   (N-1)·n elements
     reduce, gather  n elements on every rank but the root, 0 on the root
     broadcast, scatter  (N-1)·n on the root, 0 elsewhere
     all_to_all      the sum of send_counts to the other ranks
     send            n elements;  recv, barrier, split: 0

   Failure semantics: never a hang, never a crash.
     - Argument errors (negative counts, a root or peer outside the group, a group that is not
       this comm's or of which the rank is not a member, an unsupported dtype) return
       US_ERR_INVALID at issue with a sentence in c->err; nothing is queued. Mismatched
       arguments between ranks (counts, dtype, op, root; all_to_all counts; a recv of another
       size) are found inside the collective and give US_ERR_INVALID on the ranks concerned.
     - Any other failure aborts the whole launch: a rank's fn returning an error, a rank that
       returned while others wait for it in a collective, a collective that cannot complete
       within timeout_s (us_comm.timeout_s at issue; us_launch_config.timeout_s, 0 = 300 s).
       The collectives waiting return US_ERR_BACKEND and every later collective fails at once;
       messages name the world rank at fault:
         "all_reduce: rank 2 failed (it returned: <its comm->err, or its result's description>)"
         "all_reduce: rank 2 exited without joining the collective"
         "all_reduce on a group of 4 timed out after 0.5 s waiting for rank 3"
         "broadcast: <the cause above>"         (any collective after the abort)
       A rank function that fails may write its reason into comm->err before returning.
     - us_launch joins every thread (ranks and progress threads) and frees everything, handles
       never waited included. It returns US_OK when every rank returned US_OK and nothing
       aborted; otherwise the result of the first rank (in time) that returned an error, with
       "rank R failed: <its message>" in err (or US_ERR_BACKEND and the abort's cause).
   Waits are pthread_cond_timedwait slices of 20 ms that re-check the launch's abort flag and
   the deadline; per-group, per-rank arrival counters say which rank is missing.

   Thread safety: a us_comm belongs to its rank; call its functions from one thread at a time
   (usually the rank's own). The progress thread never touches the us_comm (a handle keeps its
   own message until wait() copies it into c->err), except the us_group a split fills while its
   caller waits. c->trace: when set at issue, the progress thread records the collective's
   [start, end) on the US_STREAM_COMM row ("all_reduce 4.0 MB"); the rank's thread may record
   US_STREAM_COMPUTE on the same us_trace meanwhile (one writer per row). All state lives in
   the launch (no globals): several launches may run at once, also nested inside a rank.

   split() is collective over the parent: the same color gives the same new group, ordered by
   key then parent rank; a negative color gives {size 0, rank -1, impl NULL}. group_free()
   releases this rank's membership at once (not collective; collectives already queued on the
   group still run) and empties the us_group; later calls with it, or with a copy of it, are
   refused. The shared state (a few hundred bytes) is freed by us_launch at the end, so no
   queued collective or stale copy can see it freed. The world is us_launch's (group_free on it
   does nothing).

   Handles: the threads backend does not define struct us_work (the NCCL part may); its
   handles are its own queued-collective records, cast to us_work *.
*/
#ifndef ULTRASCALE_COMM_H
#define ULTRASCALE_COMM_H

#ifndef ULTRASCALE_H
#error "ultrascale_comm.h extends ultrascale.h: include ultrascale.h first"
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- threads backend */
/* One call per rank, on its own thread, with that rank's comm. */
typedef us_result (*us_rank_fn)(us_comm *comm, void *arg);

typedef struct us_launch_config {
    double timeout_s;   /* a collective that cannot complete within this fails; 0 = 300 s */
    int p2p_rendezvous; /* 1: a send waits until its receiver has taken the message (NCCL's
                           behaviour for large messages); 0: eager, a send never waits */
    int nccl; /* 1: NCCL's semantics on a GPU (see "NCCL semantics" above): rendezvous sends, and
                 every wait of the host first waits for everything the rank has issued */
} us_launch_config;

/* Runs fn on nranks threads of this process, each with its own us_comm (name "threads",
   world = {nranks, rank}, ops = NULL: the threads backend reads and writes host memory
   directly).
   Return value: US_OK when every rank returned US_OK; otherwise the first failing rank's
   result, with a sentence naming the rank and its error in err. rank_results (may be NULL)
   receives each rank's result [nranks]. cfg may be NULL (all defaults); err may be NULL.
   Thread safety: any thread may launch; launches are independent. */
US_API us_result us_launch(int nranks, us_rank_fn fn, void *arg);
US_API us_result us_launch_ex(int nranks, us_rank_fn fn, void *arg, const us_launch_config *cfg,
                              us_result *rank_results, char *err, size_t errlen);

/* ---------------------------------------------------------------- NCCL backend and bootstrap */
/* NCCL backend and bootstrap */

/* ---------------------------------------------------------------- bootstrap
   How a process learns who it is (rank, world size, the host of rank 0) and how ranks meet.
   One process per GPU is the usual layout; the launcher of your cluster sets the environment:
       torchrun        RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT
       mpirun (OMPI)   OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE, plus MASTER_ADDR
       srun (Slurm)    SLURM_PROCID SLURM_NTASKS SLURM_LOCALID SLURM_NTASKS_PER_NODE (or
                       SLURM_STEP_TASKS_PER_NODE); MASTER_ADDR, else the first host of
                       SLURM_STEP_NODELIST / SLURM_JOB_NODELIST ("gpu[007-010]" → "gpu007")
   and us_launch_procs() is a torchrun of one node for tests and single-machine runs. */
typedef struct us_dist_env {
    int rank, world_size, local_rank, local_world_size;
    char master_addr[256]; /* host of rank 0 ("127.0.0.1" for a world of one) */
    int master_port;       /* MASTER_PORT; 29500 when only MASTER_ADDR is given */
    const char *source;    /* "torchrun", "openmpi", "slurm" or "none" (rank 0 of 1) */
} us_dist_env;

/* Reads the environment, in the precedence torchrun > Open MPI > Slurm > none.
   Return value: US_OK, or US_ERR_INVALID with a sentence in err ("RANK=4 must be below
   WORLD_SIZE=4", "a world of 8 ranks (openmpi) needs MASTER_ADDR, the host of rank 0").
   Remarks: missing local values fall back to a single node (LOCAL_RANK = RANK,
   LOCAL_WORLD_SIZE = WORLD_SIZE). */
US_API us_result us_dist_env_read(us_dist_env *e, char *err, size_t errlen);

/* Rank 0 publishes bytes[nbytes] (an ncclUniqueId, 128 bytes) and every rank receives them.
   Parameters:
     spec       "tcp://HOST:PORT": rank 0 listens on PORT (every interface, SO_REUSEADDR), the
                others connect to HOST:PORT with retries until the timeout. Every rank returns
                only after all world_size ranks have arrived, so a call with nbytes = 0 is a
                barrier. HOST is a name, an IPv4 address or a bracketed IPv6 one.
                "file://PATH": rank 0 writes PATH atomically (a temporary file + rename), the
                others poll for it. Use a fresh PATH per run (on a file system all ranks see);
                this form is not a barrier.
     timeout_s  how long to wait for the others; 0 = 300.
   Return value: US_OK, US_ERR_INVALID for a malformed spec or arguments, US_ERR_IO when the
   ranks could not meet ("rendezvous: rank 3 could not reach 10.0.0.1:29500 within 30 s:
   Connection refused"). A world of one returns at once. */
US_API us_result us_rendezvous(const char *spec, int rank, int world_size, void *bytes,
                               size_t nbytes, double timeout_s, char *err, size_t errlen);

/* A launcher for one node: starts nproc copies of argv[0] argv[1..] (argv NULL-terminated)
   with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT=<a
   free port> and NCCL_NVLS_ENABLE=0 (unless already set) in their environment, and waits.
   argv[0] with a slash is run as is; without one it is looked up in PATH, then
   /proc/self/exe is used (pass your own argv with the launcher's options removed).
   When a rank exits non-zero or by a signal, the others get grace_s seconds (0 = 30) to
   report their own errors, then SIGTERM, then SIGKILL 5 s later.
   Return value: 0 when every rank exited 0; else the first failure's exit code (128 + the
   signal number for a signal) with a sentence in err ("rank 1 was killed by signal 9; 1 other
   rank was stopped with SIGTERM"); -1 when the launch itself failed (bad arguments, fork).
   Thread safety: call from a process whose other threads do not fork; the environment of
   each rank is built before fork, the child only calls execve. */
US_API int us_launch_procs(int nproc, char *const argv[], double grace_s, char *err, size_t errlen);

#ifdef ULTRASCALE_NCCL
/* ---------------------------------------------------------------- NCCL backend
   The comm seam over NCCL (≥ 2.18 for split; ≥ 2.10 for bf16 and AVG), one process (or one
   thread) per GPU. Every collective runs on a communication stream of its own
   (cudaStreamNonBlocking, highest priority), ordered against the compute stream by events:
   compute → [ready event] → comm stream runs the NCCL call → [done event]. With w NULL the call
   then waits; with w it returns a handle at once and wait() makes the compute stream wait for
   the done event (no host round trip is needed for correctness) and also watches it from the
   host until it completes or c->timeout_s (0 = 300) passes — Playbook "overlap gradient
   all-reduce with the backward pass" with a watchdog. On a timeout or an asynchronous NCCL
   error every communicator of this rank is aborted (ncclCommAbort) and every later call
   fails fast with the first error: "rank 0: all_reduce 4.0 MB did not complete within 30 s;
   a peer may have died; communicator aborted".

   bytes_sent counts bus bytes, per rank, with the nccl-tests definitions (the bytes each rank
   puts on the wire in the bandwidth-optimal algorithm), S = the op's payload in bytes:
       all_reduce 2(N-1)/N·S           reduce_scatter, all_gather (N-1)/N·S, S = N·n elements
       broadcast, reduce S              gather, scatter (N-1)/N·S, S = N·n elements
       send S, recv 0                   all_to_all: the elements sent to other ranks
   With c->trace set each collective is recorded on the US_STREAM_COMM row with GPU times
   (events around the NCCL call, mapped to us_trace_now_us() through a pair taken at init).

   NVLink multicast (NVLS) is switched off: us_nccl_init does setenv("NCCL_NVLS_ENABLE", "0", 0)
   before creating communicators (the GPU machine does not allow it); export
   NCCL_NVLS_ENABLE=1 before the call to override.

   Point-to-point calls are queued on the one comm stream in call order, so two ranks that
   both send first and then receive deadlock: order pairs (even ranks send first, odd ranks
   receive first) or use all_to_all. */

/* Fills *c for this process's `rank` of `world_size` on the CUDA device current now.
   Parameters:
     ops             the memory the collectives read and write (stored in c->ops; may be NULL)
     compute_stream  the cudaStream_t the ops run on (us_cuda_stream(&ops)); NULL = the legacy
                     default stream
     rendezvous      how rank 0's ncclUniqueId reaches the others (us_rendezvous spec); NULL =
                     "tcp://MASTER_ADDR:MASTER_PORT" from us_dist_env_read (MASTER_PORT + 1
                     under torchrun, whose agent store holds MASTER_PORT). Not used for a world
                     of one.
     timeout_s       for the rendezvous and, stored in c->timeout_s, for every collective
                     (0 = 300 s); set c->timeout_s afterwards to bound the collectives apart.
   Return value: US_OK, US_ERR_INVALID, US_ERR_IO (the rendezvous) or US_ERR_BACKEND, with a
   sentence in err and in c->err.
   Thread safety: one us_comm per thread; call its functions with the same device current. */
US_API us_result us_nccl_init(us_comm *c, us_ops *ops, void *compute_stream, int rank,
                              int world_size, const char *rendezvous, double timeout_s, char *err,
                              size_t errlen);
/* Waits for outstanding work (unless aborted), destroys the communicators (groups first),
   the stream and events. Handles never waited for are freed too. */
US_API void us_nccl_free(us_comm *c);
#endif /* ULTRASCALE_NCCL */

#ifdef __cplusplus
}
#endif
#endif /* ULTRASCALE_COMM_H */

/* ==================================================================================== */
/*                                   IMPLEMENTATION                                      */
/* ==================================================================================== */
#ifdef ULTRASCALE_IMPLEMENTATION
#ifndef ULTRASCALE_COMM_IMPLEMENTATION_DONE
#define ULTRASCALE_COMM_IMPLEMENTATION_DONE

#include <pthread.h>
#include <time.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if !defined(CLOCK_MONOTONIC)
#error \
    "ultrascale_comm.h needs POSIX clocks: compile with -D_POSIX_C_SOURCE=200809L or -std=gnu99 (or define _POSIX_C_SOURCE before the first #include)"
#endif

#ifndef US_MALLOC
#define US_MALLOC(sz) malloc(sz)
#define US_FREE(p) free(p)
#endif

/* ------------------------------------------------------------------------------------ */
// >>threads  ranks as threads: a progress thread per rank, ring collectives over shared memory
/* ------------------------------------------------------------------------------------ */
enum {
    US__THR_ALL_REDUCE,
    US__THR_REDUCE,
    US__THR_REDUCE_SCATTER,
    US__THR_ALL_GATHER,
    US__THR_GATHER,
    US__THR_SCATTER,
    US__THR_BROADCAST,
    US__THR_SEND,
    US__THR_RECV,
    US__THR_ALL_TO_ALL,
    US__THR_BARRIER,
    US__THR_SPLIT,
    US__THR_SENDRECV
};

static const char *const us__thr_names[] = {
    "all_reduce", "reduce", "reduce_scatter", "all_gather", "gather", "scatter", "broadcast",
    "send",       "recv",   "all_to_all",     "barrier",    "split",  "sendrecv"};
#define US__THR_SLICE_S 0.02 /* every wait re-checks the abort flag and the deadline this often */
/* NCCL semantics: every rank waiting, no progress this long. 0.5 s fired falsely on a 2-core
   machine running make test beside other work (its threads starved that long); 2 s leaves a
   margin, and a real deadlock is still reported within a few seconds */
#define US__THR_DEADLOCK_S 2.0

typedef struct us__thr_launch us__thr_launch;
typedef struct us__thr_rank us__thr_rank;
typedef struct us__thr_lane us__thr_lane;

/* What a member publishes for the collective in progress; read by the others between the
   first and the last barrier of that collective only. */
typedef struct us__thr_slot {
    void *dst;
    const void *src;
    void *scratch;
    const int64_t
        *counts; /* all_to_all: [4][size] recv counts, recv displs, send counts, send displs */
    int64_t n;
    int dt, op, root;
    int color, key;
    void *newg; /* split: the new group, published by its first member */
} us__thr_slot;

/* An eager point-to-point message; the payload follows the header. */
typedef struct us__thr_msg {
    struct us__thr_msg *next;
    int from, to; /* group ranks */
    int64_t n;
    us_dtype dt;
    int taken, abandoned; /* rendezvous: the receiver copied it; the sender stopped waiting */
    double align_;        /* keeps the payload 8-byte aligned */
} us__thr_msg;

/* A group's shared state: one object, shared by its members, in the launch's list. */
typedef struct us__thr_group {
    struct us__thr_group *next;
    int size;
    int *members;    /* [size] world ranks, in group-rank order */
    int64_t *arrive; /* [size] barriers each member has reached (monotonic) */
    int *released;   /* [size] the member has called group_free (memory kept to the launch's end) */
    us__thr_slot *slot;   /* [size] */
    us__thr_msg *msgs;    /* send/recv FIFO, oldest first */
    us__thr_lane **lanes; /* [size] a dup's: each member's own progress thread (NULL: the rank's) */
    pthread_cond_t cv;    /* signalled on every arrival and message */
} us__thr_group;

/* A queued collective; its address is the us_work handle. */
typedef struct us__thr_op {
    struct us__thr_op *qnext;       /* the progress thread's FIFO */
    struct us__thr_op *prev, *next; /* the rank's handles not yet waited */
    us__thr_rank *owner;
    us__thr_lane *lane; /* the progress thread that runs it */
    int kind;
    us__thr_group *g;
    int me; /* the group and this rank's index in it */
    void *dst;
    const void *src;
    int64_t n;
    us_dtype dt;
    us_reduce_op op;
    int root;        /* root or peer */
    int64_t *counts; /* all_to_all: a copy of the four [size] arrays */
    int color, key;
    us_group *out; /* split */
    us_trace *trace;
    int64_t bytes, payload;
    double timeout_s;
    int64_t rn;
    int rpeer; /* sendrecv: the receive (dst, rn elements from rpeer) */
    int done;
    int64_t seq; /* the rank's issue count when it was issued (1 = its first) */
    us_result result;
    char err[256];
} us__thr_op;

/* A progress thread and its queue. Every rank has one; a group made by dup gives each member
   another, so the dup's operations never wait behind the rank's other work (nor it behind them). */
struct us__thr_lane {
    us__thr_rank *rk;
    us__thr_lane *next; /* the rank's dup lanes */
    pthread_t worker;
    int worker_started;
    pthread_cond_t cv; /* work queued, or shutdown */
    us__thr_op *qhead, *qtail;
    int busy, shutdown;
    char *scratch;
    size_t scratch_cap; /* reduce_scatter's scratch */
};

struct us__thr_rank {
    us_comm comm;
    us__thr_launch *L;
    int rank;
    pthread_t thread;
    int thread_started;
    us__thr_lane lane;      /* the progress thread of every group but dups */
    us__thr_lane *lanes;    /* the dups' progress threads */
    pthread_cond_t done_cv; /* an op of this rank finished */
    us__thr_op *live;       /* handles not yet waited (freed by us_launch otherwise) */
    int64_t issued;         /* operations issued so far */
    int syncing;            /* NCCL semantics: waiting for every operation issued */
    int returned;
    us_result result;
};

struct us__thr_launch {
    pthread_mutex_t mu; /* guards every counter, queue, list and flag below */
    int nranks;
    us_rank_fn fn;
    void *arg;
    double timeout_s;
    int rendezvous;      /* us_launch_config.p2p_rendezvous */
    int nccl;            /* us_launch_config.nccl */
    double progress_t;   /* when an operation last made progress (NCCL semantics' watchdog) */
    double check_t;      /* when the watchdog last looked */
    double seen_t;       /* the progress_t it saw then */
    double idle_s;       /* the time counted since, at most 10 slices per look */
    int deadlock;        /* the watchdog aborted the launch: its cause is the launch's error */
    us__thr_rank *ranks; /* [nranks] */
    us__thr_group *groups, *world;
    int aborted;
    char cause[512]; /* the first failure, naming the rank at fault */
    int first_fail;
    char fail_msg[320]; /* the first rank whose fn returned an error */
};

/* One slice of a wait; the absolute time is CLOCK_REALTIME (the condition's default clock),
   deadlines are kept on CLOCK_MONOTONIC, so a clock jump shortens or stretches one slice only. */
static void us__thr_wait_slice(pthread_cond_t *cv, pthread_mutex_t *mu, double s) {
    struct timespec ts;
    long long ns;
    if (s > US__THR_SLICE_S) s = US__THR_SLICE_S;
    if (s < 1e-4) s = 1e-4;
    clock_gettime(CLOCK_REALTIME, &ts);
    ns = (long long)ts.tv_nsec + (long long)(s * 1e9);
    ts.tv_sec += (time_t)(ns / 1000000000LL);
    ts.tv_nsec = (long)(ns % 1000000000LL);
    pthread_cond_timedwait(cv, mu, &ts);
}

static int us__thr_mod(int a, int n) {
    a %= n;
    return a < 0 ? a + n : a;
}

static int64_t us__thr_chunk_len(int64_t K, int N, int i) { return K / N + (i < K % N ? 1 : 0); }

static int64_t us__thr_chunk_off(int64_t K, int N, int i) {
    return (int64_t)i * (K / N) + (i < K % N ? i : K % N);
}

static size_t us__thr_dsize(us_dtype dt) { return us_dtype_size(dt); }

/* ---- reductions: out[i] = a[i] ⊕ b[i], read before written, so out may alias a or b */
#define US__THR_LOOP(T, EXPR)                           \
    do {                                                \
        T *o_ = (T *)out;                               \
        const T *x_ = (const T *)a, *y_ = (const T *)b; \
        for (i = 0; i < n; i++) {                       \
            T u = x_[i], v = y_[i];                     \
            o_[i] = (EXPR);                             \
        }                                               \
    } while (0)

static void us__thr_reduce3(void *out, const void *a, const void *b, int64_t n, us_dtype dt,
                            us_reduce_op op) {
    int64_t i;
    int mx = op == US_REDUCE_MAX;
    switch (dt) {
    case US_F32:
        if (mx)
            US__THR_LOOP(float, (u > v || u != u) ? u : v);
        else
            US__THR_LOOP(float, u + v);
        break;
    case US_F64:
        if (mx)
            US__THR_LOOP(double, (u > v || u != u) ? u : v);
        else
            US__THR_LOOP(double, u + v);
        break;
    case US_I32: /* sums wrap (unsigned arithmetic) instead of overflowing */
        if (mx)
            US__THR_LOOP(int32_t, u > v ? u : v);
        else
            US__THR_LOOP(int32_t, (int32_t)((uint32_t)u + (uint32_t)v));
        break;
    case US_BF16:
    case US_F16: { /* 16-bit floats: add in fp32, round once per step */
        uint16_t *o = (uint16_t *)out;
        const uint16_t *x = (const uint16_t *)a, *y = (const uint16_t *)b;
        float (*dec)(uint16_t) = dt == US_BF16 ? us_bf16_to_f32 : us_f16_to_f32;
        uint16_t (*enc)(float) = dt == US_BF16 ? us_f32_to_bf16 : us_f32_to_f16;
        for (i = 0; i < n; i++) {
            float u = dec(x[i]), v = dec(y[i]);
            if (mx)
                o[i] = (u > v || u != u) ? x[i] : y[i];
            else
                o[i] = enc(u + v);
        }
        break;
    }
    default:
        break; /* refused at issue */
    }
}

#undef US__THR_LOOP

static void us__thr_divide(void *buf, int64_t n, us_dtype dt, int N) {
    int64_t i;
    switch (dt) {
    case US_F32: {
        float *p = (float *)buf;
        for (i = 0; i < n; i++) p[i] = p[i] / (float)N;
        break;
    }
    case US_F64: {
        double *p = (double *)buf;
        for (i = 0; i < n; i++) p[i] = p[i] / (double)N;
        break;
    }
    case US_I32: {
        int32_t *p = (int32_t *)buf;
        for (i = 0; i < n; i++) p[i] = p[i] / N;
        break;
    }
    case US_BF16: {
        uint16_t *p = (uint16_t *)buf;
        for (i = 0; i < n; i++) p[i] = us_f32_to_bf16(us_bf16_to_f32(p[i]) / (float)N);
        break;
    }
    case US_F16: {
        uint16_t *p = (uint16_t *)buf;
        for (i = 0; i < n; i++) p[i] = us_f32_to_f16(us_f16_to_f32(p[i]) / (float)N);
        break;
    }
    default:
        break;
    }
}

/* ---- launch-wide state changes (caller holds L->mu) */
static void us__thr_wake_all(us__thr_launch *L) {
    us__thr_group *g;
    int r;
    for (g = L->groups; g; g = g->next) pthread_cond_broadcast(&g->cv);
    for (r = 0; r < L->nranks; r++) {
        us__thr_lane *ln;
        pthread_cond_broadcast(&L->ranks[r].lane.cv);
        for (ln = L->ranks[r].lanes; ln; ln = ln->next) pthread_cond_broadcast(&ln->cv);
        pthread_cond_broadcast(&L->ranks[r].done_cv);
    }
}

static void us__thr_abort(us__thr_launch *L, const char *fmt, ...) {
    if (!L->aborted) {
        va_list ap;
        L->aborted = 1;
        va_start(ap, fmt);
        vsnprintf(L->cause, sizeof L->cause, fmt, ap);
        va_end(ap);
    }
    us__thr_wake_all(L);
}

/* A rank is gone when its fn has returned and its progress threads have nothing left to run:
   it will never join another collective. */
static int us__thr_gone(const us__thr_rank *rk) {
    const us__thr_lane *ln;
    if (!rk->returned || rk->lane.busy || rk->lane.qhead) return 0;
    for (ln = rk->lanes; ln; ln = ln->next)
        if (ln->busy || ln->qhead) return 0;
    return 1;
}

/* "<op>: <cause>", without repeating the op when the cause starts with it */
static void us__thr_aborted(char *err, size_t errlen, const char *name, const char *cause) {
    size_t k = strlen(name);
    if (!strncmp(cause, name, k) && cause[k] == ' ')
        us__errf(err, errlen, "%s", cause);
    else
        us__errf(err, errlen, "%s: %s", name, cause);
}

/* ---- groups */
static us__thr_group *us__thr_group_new(us__thr_launch *L, int size, const int *world_ranks) {
    size_t bytes = sizeof(us__thr_group) +
                   (size_t)size * (sizeof(us__thr_slot) + sizeof(int64_t) + 2 * sizeof(int));
    us__thr_group *g = (us__thr_group *)US_MALLOC(bytes);
    if (!g) return NULL;
    memset(g, 0, bytes);
    g->slot = (us__thr_slot *)(g + 1);
    g->arrive = (int64_t *)(g->slot + size);
    g->members = (int *)(g->arrive + size);
    g->released = g->members + size;
    g->size = size;
    memcpy(g->members, world_ranks, (size_t)size * sizeof(int));
    if (pthread_cond_init(&g->cv, NULL) != 0) {
        US_FREE(g);
        return NULL;
    }
    g->next = L->groups; /* caller holds L->mu */
    L->groups = g;
    return g;
}

static void us__thr_group_destroy(us__thr_group *g) {
    while (g->msgs) {
        us__thr_msg *m = g->msgs;
        g->msgs = m->next;
        US_FREE(m);
    }
    US_FREE(g->lanes);
    pthread_cond_destroy(&g->cv);
    US_FREE(g);
}

/* ---- the progress thread's view of one collective */
typedef struct us__thr_x {
    us__thr_launch *L;
    us__thr_rank *rk;
    us__thr_lane *lane;
    us__thr_group *g;
    int me, N;
    const char *name;
    double deadline, timeout_s;
    char *err;
    size_t errlen;
} us__thr_x;

/* Names the first member that has not reached barrier `target`, or -1. */
static int us__thr_missing(const us__thr_group *g, int64_t target) {
    int j;
    for (j = 0; j < g->size; j++)
        if (g->arrive[j] < target) return j;
    return -1;
}

/* Checks the abort flag, a gone rank and the deadline while waiting for group rank j (caller
   holds L->mu). Returns US_OK to keep waiting. */
static us_result us__thr_check_wait(us__thr_x *x, int j, const char *gone_what) {
    us__thr_launch *L = x->L;
    int wr = x->g->members[j];
    if (L->aborted) {
        us__thr_aborted(x->err, x->errlen, x->name, L->cause);
        return US_ERR_BACKEND;
    }
    if (us__thr_gone(&L->ranks[wr])) {
        us__errf(x->err, x->errlen, "%s: rank %d exited without %s", x->name, wr, gone_what);
        us__thr_abort(L, "rank %d exited without %s (%s on a group of %d)", wr, gone_what, x->name,
                      x->N);
        return US_ERR_BACKEND;
    }
    if (us__now_s() >= x->deadline) {
        us__errf(x->err, x->errlen, "%s on a group of %d timed out after %g s waiting for rank %d",
                 x->name, x->N, x->timeout_s, wr);
        us__thr_abort(L, "%s", x->err);
        return US_ERR_BACKEND;
    }
    return US_OK;
}

/* The group barrier between ring steps: arrive, then wait for every member to arrive. */
static us_result us__thr_sync(us__thr_x *x) {
    us__thr_group *g = x->g;
    us_result r = US_OK;
    int64_t target;
    int j, last;
    pthread_mutex_lock(&x->L->mu);
    target = ++g->arrive[x->me];
    x->L->progress_t = us__now_s();
    last = us__thr_missing(g, target) < 0;
    while ((j = us__thr_missing(g, target)) >= 0 || x->L->aborted) {
        if (j < 0) j = x->me;
        if ((r = us__thr_check_wait(x, j, "joining the collective")) != US_OK) break;
        us__thr_wait_slice(&g->cv, &x->L->mu, x->deadline - us__now_s());
    }
    pthread_mutex_unlock(&x->L->mu);
    /* Only the last arrival wakes the others (an abort or a gone rank wakes them through
       us__thr_wake_all), and after unlocking, so that they do not wake into a held mutex: a
       broadcast per arrival under the lock cost every waiter N wake-ups and lock waits. The
       group lives to the launch's end, so it is still there. */
    if (last) pthread_cond_broadcast(&g->cv);
    return r;
}

/* Every member passed the same count, dtype, op and root (read after the first barrier). */
static us_result us__thr_agree(us__thr_x *x) {
    const us__thr_slot *s = x->g->slot;
    const char *what = NULL;
    long long a = 0, b = 0;
    int j;
    for (j = 1; j < x->N && !what; j++) {
        if (s[j].n != s[0].n) {
            what = "element count";
            a = s[0].n;
            b = s[j].n;
        } else if (s[j].dt != s[0].dt) {
            what = "dtype";
            a = s[0].dt;
            b = s[j].dt;
        } else if (s[j].op != s[0].op) {
            what = "reduce op";
            a = s[0].op;
            b = s[j].op;
        } else if (s[j].root != s[0].root) {
            what = "root";
            a = s[0].root;
            b = s[j].root;
        }
    }
    if (!what) return US_OK;
    us__errf(x->err, x->errlen, "%s: ranks %d and %d passed a different %s (%lld and %lld)",
             x->name, x->g->members[0], x->g->members[j - 1], what, a, b);
    return US_ERR_INVALID;
}

/* Publishes this member's slot, waits for everyone's, and checks that the arguments agree. */
static us_result us__thr_publish(us__thr_x *x, const us__thr_op *o, int check) {
    us__thr_slot *s = &x->g->slot[x->me];
    us_result r;
    s->dst = o->dst;
    s->src = o->src;
    s->counts = o->counts;
    s->n = o->n;
    s->dt = (int)o->dt;
    s->op = (int)o->op;
    s->root = o->root;
    s->color = o->color;
    s->key = o->key;
    s->newg = NULL;
    if ((r = us__thr_sync(x)) != US_OK) return r;
    return check ? us__thr_agree(x) : US_OK;
}

/* Ends a collective: nobody reads this member's buffers or slot after it. A ring whose last
   step ended in a barrier has that guarantee already (no one reads between the two barriers), so
   it returns without this one: each barrier is a sleep and a wake-up for every member. */
static us_result us__thr_finish(us__thr_x *x, us_result r) {
    us_result f = us__thr_sync(x);
    return r != US_OK ? r : f;
}

/* the lane's scratch, at least `bytes` of it (NULL when out of memory: the caller says so) */
static char *us__thr_scratch(us__thr_lane *ln, size_t bytes) {
    if (ln->scratch_cap < bytes) {
        char *p = (char *)US_MALLOC(bytes);
        if (!p) return NULL;
        US_FREE(ln->scratch);
        ln->scratch = p;
        ln->scratch_cap = bytes;
    }
    return ln->scratch;
}

/* all_reduce: the Playbook's ring. Reduce-scatter step s: rank q combines chunk q-s-2 from its
   predecessor into its own; after N-1 steps it holds chunk q fully reduced (reduced once).
   All-gather step s: rank q copies chunk q-1-s from its predecessor. Two members summing are
   the ring in two barriers instead of four: each chunk is the two buffers added once, and
   a + b = b + a to the bit, so each member adds the whole of both into its scratch and writes
   its buffer after the barrier that says the other has read it. (Max is left to the ring:
   max(+0, −0) depends on the order.) */
static us_result us__thr_run_all_reduce(us__thr_x *x, us__thr_op *o) {
    int N = x->N, me = x->me, s;
    size_t es = us__thr_dsize(o->dt);
    int64_t K = o->n;
    int two = N == 2 && K > 0 && (o->op == US_REDUCE_SUM || o->op == US_REDUCE_AVG);
    char *pair = two ? us__thr_scratch(x->lane, (size_t)K * es) : NULL;
    us_result r = us__thr_publish(x, o, 1);
    if (r == US_OK && pair) {
        us__thr_reduce3(pair, x->g->slot[1 - me].dst, o->dst, K, o->dt, o->op);
        if (o->op == US_REDUCE_AVG) us__thr_divide(pair, K, o->dt, N);
        r = us__thr_sync(x);
        if (r == US_OK) memcpy(o->dst, pair, (size_t)K * es);
        return r;
    }
    if (r == US_OK && N > 1 && K > 0) {
        char *mine = (char *)o->dst, *theirs = (char *)x->g->slot[us__thr_mod(me - 1, N)].dst;
        for (s = 0; s < N - 1 && r == US_OK; s++) {
            int c = us__thr_mod(me - s - 2, N);
            size_t off = (size_t)us__thr_chunk_off(K, N, c) * es;
            int64_t len = us__thr_chunk_len(K, N, c);
            us__thr_reduce3(mine + off, theirs + off, mine + off, len, o->dt, o->op);
            if (s == N - 2 && o->op == US_REDUCE_AVG) us__thr_divide(mine + off, len, o->dt, N);
            r = us__thr_sync(x);
        }
        for (s = 0; s < N - 1 && r == US_OK; s++) {
            int c = us__thr_mod(me - 1 - s, N);
            size_t off = (size_t)us__thr_chunk_off(K, N, c) * es;
            memcpy(mine + off, theirs + off, (size_t)us__thr_chunk_len(K, N, c) * es);
            r = us__thr_sync(x);
        }
        if (r == US_OK) return r; /* the last step's barrier ends it */
    }
    return r == US_ERR_BACKEND ? r : us__thr_finish(x, r);
}

/* reduce_scatter: the ring's first half over src; partial sums travel through two scratch
   blocks per rank (the successor reads one while this rank writes the other), the last step
   writes dst (which may be src + rank·n: each element is read before it is written). */
static us_result us__thr_run_reduce_scatter(us__thr_x *x, us__thr_op *o) {
    int N = x->N, me = x->me, s;
    size_t es = us__thr_dsize(o->dt), blk = (size_t)o->n * es;
    us__thr_rank *rk = x->rk;
    us__thr_lane *ln = x->lane;
    us_result r;
    if (N > 1 && blk && !us__thr_scratch(ln, 2 * blk)) {
        us__errf(x->err, x->errlen, "%s: rank %d is out of memory for %zu bytes of scratch",
                 x->name, rk->rank, 2 * blk);
        pthread_mutex_lock(&x->L->mu);
        us__thr_abort(x->L, "%s", x->err);
        pthread_mutex_unlock(&x->L->mu);
        return US_ERR_OOM;
    }
    x->g->slot[me].scratch = ln->scratch;
    r = us__thr_publish(x, o, 1);
    if (r == US_OK && N == 1) {
        if (o->dst != o->src && blk) memmove(o->dst, o->src, blk);
    } else if (r == US_OK && blk) {
        const us__thr_slot *pred = &x->g->slot[us__thr_mod(me - 1, N)];
        const char *src = (const char *)o->src;
        for (s = 0; s < N - 1 && r == US_OK; s++) {
            int c = us__thr_mod(me - s - 2, N);
            const char *in = s == 0 ? (const char *)pred->src + (size_t)c * blk
                                    : (const char *)pred->scratch + (size_t)((s - 1) & 1) * blk;
            char *out = s == N - 2 ? (char *)o->dst : ln->scratch + (size_t)(s & 1) * blk;
            us__thr_reduce3(out, in, src + (size_t)c * blk, o->n, o->dt, o->op);
            if (s == N - 2 && o->op == US_REDUCE_AVG) us__thr_divide(out, o->n, o->dt, N);
            r = us__thr_sync(x);
        }
        if (r == US_OK) return r; /* the last step's barrier ends it */
    }
    return r == US_ERR_BACKEND ? r : us__thr_finish(x, r);
}

/* all_gather: the ring's second half; step s copies block me-1-s from the predecessor. */
static us_result us__thr_run_all_gather(us__thr_x *x, us__thr_op *o) {
    int N = x->N, me = x->me, s;
    size_t blk = (size_t)o->n * us__thr_dsize(o->dt);
    char *dst = (char *)o->dst;
    us_result r;
    if (blk && dst + (size_t)me * blk != (const char *)o->src)
        memmove(dst + (size_t)me * blk, o->src, blk);
    r = us__thr_publish(x, o, 1);
    if (r == US_OK && N > 1 && blk) {
        const char *theirs = (const char *)x->g->slot[us__thr_mod(me - 1, N)].dst;
        for (s = 0; s < N - 1 && r == US_OK; s++) {
            size_t off = (size_t)us__thr_mod(me - 1 - s, N) * blk;
            memcpy(dst + off, theirs + off, blk);
            r = us__thr_sync(x);
        }
        if (r == US_OK) return r; /* the last step's barrier ends it */
    }
    return r == US_ERR_BACKEND ? r : us__thr_finish(x, r);
}

/* reduce, gather, scatter, broadcast: direct copies from the published buffers. */
static us_result us__thr_run_rooted(us__thr_x *x, us__thr_op *o) {
    int N = x->N, me = x->me, root = o->root, j;
    size_t blk = (size_t)o->n * us__thr_dsize(o->dt);
    const us__thr_slot *sl = x->g->slot;
    us_result r = us__thr_publish(x, o, 1);
    if (r != US_OK) return r == US_ERR_BACKEND ? r : us__thr_finish(x, r);
    if (!blk) return us__thr_finish(x, US_OK);
    switch (o->kind) {
    case US__THR_REDUCE:
        if (me == root) {
            if (o->dst != o->src) memmove(o->dst, o->src, blk);
            for (j = 1; j < N; j++)
                us__thr_reduce3(o->dst, o->dst, sl[(root + j) % N].src, o->n, o->dt, o->op);
            if (o->op == US_REDUCE_AVG && N > 1) us__thr_divide(o->dst, o->n, o->dt, N);
        }
        break;
    case US__THR_GATHER: {
        char *to = (char *)sl[root].dst + (size_t)me * blk;
        if (to != (const char *)o->src) memmove(to, o->src, blk);
        break;
    }
    case US__THR_SCATTER: {
        const char *from = (const char *)sl[root].src + (size_t)me * blk;
        if (from != (const char *)o->dst) memmove(o->dst, from, blk);
        break;
    }
    case US__THR_BROADCAST:
        if (me != root) memcpy(o->dst, sl[root].dst, blk);
        break;
    default:
        break;
    }
    return us__thr_finish(x, US_OK);
}

/* all_to_all: each rank pulls, from every peer, the block that peer sends it. Counts are
   checked pairwise by both ranks of the pair, so both report a mismatch. */
static us_result us__thr_run_all_to_all(us__thr_x *x, us__thr_op *o) {
    int N = x->N, me = x->me, j;
    size_t es = us__thr_dsize(o->dt);
    const us__thr_slot *sl = x->g->slot;
    us_result r = us__thr_publish(x, o, 0);
    if (r != US_OK) return r;
    for (j = 0; j < N && r == US_OK; j++) {
        const int64_t *mine = o->counts, *peer = sl[j].counts; /* [rc, rd, sc, sd][N] */
        if (sl[j].dt != (int)o->dt) {
            us__errf(x->err, x->errlen, "%s: ranks %d and %d passed different dtypes", x->name,
                     x->g->members[me], x->g->members[j]);
            r = US_ERR_INVALID;
        } else if (peer[2 * N + me] != mine[j]) {
            us__errf(x->err, x->errlen,
                     "%s: rank %d sends %lld elements to rank %d, which expects %lld", x->name,
                     x->g->members[j], (long long)peer[2 * N + me], x->g->members[me],
                     (long long)mine[j]);
            r = US_ERR_INVALID;
        } else if (mine[2 * N + j] != peer[me]) {
            us__errf(x->err, x->errlen,
                     "%s: rank %d sends %lld elements to rank %d, which expects %lld", x->name,
                     x->g->members[me], (long long)mine[2 * N + j], x->g->members[j],
                     (long long)peer[me]);
            r = US_ERR_INVALID;
        }
    }
    for (j = 0; j < N && r == US_OK; j++) {
        const int64_t *peer = sl[j].counts;
        if (o->counts[j] > 0)
            memmove((char *)o->dst + (size_t)o->counts[N + j] * es,
                    (const char *)sl[j].src + (size_t)peer[3 * N + me] * es,
                    (size_t)o->counts[j] * es);
    }
    return us__thr_finish(x, r);
}

/* send: posts the message into the group's FIFO (eager: done); under rendezvous the sender
   then waits until the receiver has taken it, and frees it. */
static us_result us__thr_post(us__thr_x *x, const void *src, int64_t n, us_dtype dt, int peer,
                              us__thr_msg **out) {
    size_t blk = (size_t)n * us__thr_dsize(dt);
    us__thr_msg *m = (us__thr_msg *)US_MALLOC(sizeof *m + blk), **tail;
    *out = NULL;
    if (m) { /* the copy outside the lock, which every rank's progress thread takes */
        memset(m, 0, sizeof *m);
        m->from = x->me;
        m->to = peer;
        m->n = n;
        m->dt = dt;
        if (blk) memcpy(m + 1, src, blk);
    }
    pthread_mutex_lock(&x->L->mu);
    if (x->L->aborted) {
        us__thr_aborted(x->err, x->errlen, x->name, x->L->cause);
        pthread_mutex_unlock(&x->L->mu);
        US_FREE(m);
        return US_ERR_BACKEND;
    }
    if (!m) {
        us__errf(x->err, x->errlen, "%s: rank %d is out of memory for a message of %zu bytes",
                 x->name, x->rk->rank, blk);
        us__thr_abort(x->L, "%s", x->err);
        pthread_mutex_unlock(&x->L->mu);
        return US_ERR_OOM;
    }
    for (tail = &x->g->msgs; *tail; tail = &(*tail)->next) {
    }
    *tail = m;
    if (x->L->rendezvous) *out = m; /* the sender's to wait on */
    x->L->progress_t = us__now_s();
    pthread_mutex_unlock(&x->L->mu);
    pthread_cond_broadcast(&x->g->cv); /* (unlocked: the receiver wakes to a free mutex) */
    return US_OK;
}

static us_result us__thr_await_taken(us__thr_x *x, us__thr_msg *m) {
    us_result r = US_OK;
    if (!m) return US_OK;
    pthread_mutex_lock(&x->L->mu);
    while (!m->taken) {
        if ((r = us__thr_check_wait(x, m->to, "receiving the message")) != US_OK) break;
        us__thr_wait_slice(&x->g->cv, &x->L->mu, x->deadline - us__now_s());
    }
    if (m->taken)
        US_FREE(m);
    else
        m->abandoned = 1; /* still queued: the receiver (or the group's end) frees it */
    pthread_mutex_unlock(&x->L->mu);
    return r;
}

static us_result us__thr_run_send(us__thr_x *x, us__thr_op *o) {
    us__thr_msg *m;
    us_result r = us__thr_post(x, o->src, o->n, o->dt, o->root, &m);
    return r != US_OK ? r : us__thr_await_taken(x, m);
}

/* recv: takes the oldest message from the peer, waiting for it like a barrier waits. Under
   rendezvous the sender frees the message once it is marked taken. */
static us_result us__thr_recv_from(us__thr_x *x, void *dst, int64_t n, us_dtype dt, int peer) {
    us__thr_msg *m = NULL, **pp;
    us_result r = US_OK;
    int keep;
    pthread_mutex_lock(&x->L->mu);
    for (;;) {
        for (pp = &x->g->msgs; *pp; pp = &(*pp)->next)
            if ((*pp)->from == peer && (*pp)->to == x->me) break;
        if (*pp && !x->L->aborted) {
            m = *pp;
            *pp = m->next;
            break;
        }
        if ((r = us__thr_check_wait(x, peer, "sending the message")) != US_OK) break;
        us__thr_wait_slice(&x->g->cv, &x->L->mu, x->deadline - us__now_s());
    }
    pthread_mutex_unlock(&x->L->mu);
    if (!m) return r;
    if (m->n != n || m->dt != dt) {
        us__errf(x->err, x->errlen,
                 "%s: rank %d sent %lld %s elements but rank %d receives %lld %s", x->name,
                 x->g->members[peer], (long long)m->n, us_dtype_name(m->dt), x->rk->rank,
                 (long long)n, us_dtype_name(dt));
        r = US_ERR_INVALID;
    } else if (n > 0) {
        memcpy(dst, m + 1, (size_t)n * us__thr_dsize(dt));
    }
    pthread_mutex_lock(&x->L->mu);
    keep = x->L->rendezvous && !m->abandoned; /* the sender waits for it and frees it */
    m->taken = 1;
    x->L->progress_t = us__now_s();
    pthread_mutex_unlock(&x->L->mu);
    pthread_cond_broadcast(&x->g->cv); /* (unlocked: the sender wakes to a free mutex) */
    if (!keep) US_FREE(m);
    return r;
}

static us_result us__thr_run_recv(us__thr_x *x, us__thr_op *o) {
    return us__thr_recv_from(x, o->dst, o->n, o->dt, o->root);
}

/* sendrecv: post, receive, then wait for the posted message to be taken. */
static us_result us__thr_run_sendrecv(us__thr_x *x, us__thr_op *o) {
    us__thr_msg *m;
    us_result r = us__thr_post(x, o->src, o->n, o->dt, o->root, &m), r2;
    if (r != US_OK) return r;
    r = us__thr_recv_from(x, o->dst, o->rn, o->dt, o->rpeer);
    r2 = us__thr_await_taken(x, m);
    return r != US_OK ? r : r2;
}

/* split: publish (color, key); the first member of each new group (in key order) creates it
   and publishes it; the others pick it up. */
static us_result us__thr_run_split(us__thr_x *x, us__thr_op *o) {
    int N = x->N, me = x->me, j, k, m = 0, mine = -1;
    int *order = NULL, *world = NULL;
    const us__thr_slot *sl = x->g->slot;
    us_result r = us__thr_publish(x, o, 0), res = US_OK;
    if (r != US_OK) return r;
    o->out->size = 0;
    o->out->rank = -1;
    o->out->impl = NULL;
    if (o->color >= 0) {
        order = (int *)US_MALLOC(2 * (size_t)N * sizeof(int));
        if (!order)
            res = US_ERR_OOM;
        else {
            world = order + N;
            for (j = 0; j < N; j++) { /* insertion sort by (key, parent rank) */
                if (sl[j].color != o->color) continue;
                for (k = m; k > 0 && sl[order[k - 1]].key > sl[j].key; k--) order[k] = order[k - 1];
                order[k] = j;
                m++;
            }
            for (k = 0; k < m; k++) {
                world[k] = x->g->members[order[k]];
                if (order[k] == me) mine = k;
            }
            if (order[0] == me) {
                pthread_mutex_lock(&x->L->mu);
                x->g->slot[me].newg = us__thr_group_new(x->L, m, world);
                pthread_mutex_unlock(&x->L->mu);
            }
        }
    }
    r = us__thr_sync(x);
    if (r == US_OK && res == US_OK && o->color >= 0) {
        us__thr_group *ng = (us__thr_group *)sl[order[0]].newg;
        if (!ng)
            res = US_ERR_OOM;
        else {
            o->out->size = m;
            o->out->rank = mine;
            o->out->impl = ng;
        }
    }
    if (res == US_ERR_OOM)
        us__errf(x->err, x->errlen, "%s: out of memory for the new group", x->name);
    US_FREE(order);
    if (r != US_OK) return r;
    return us__thr_finish(x, res);
}

static void us__thr_execute(us__thr_lane *ln, us__thr_op *o) {
    us__thr_x x;
    us__thr_rank *rk = ln->rk;
    us__thr_launch *L = rk->L;
    double t0 = o->trace ? us_trace_now_us() : 0.0;
    x.L = L;
    x.rk = rk;
    x.lane = ln;
    x.g = o->g;
    x.me = o->me;
    x.N = o->g->size;
    x.name = us__thr_names[o->kind];
    x.timeout_s = o->timeout_s;
    x.deadline = us__now_s() + o->timeout_s;
    x.err = o->err;
    x.errlen = sizeof o->err;
    pthread_mutex_lock(&L->mu);
    if (L->aborted) { /* fail fast after an abort */
        us__thr_aborted(o->err, sizeof o->err, x.name, L->cause);
        o->result = US_ERR_BACKEND;
        pthread_mutex_unlock(&L->mu);
        return;
    }
    pthread_mutex_unlock(&L->mu);
    switch (o->kind) {
    case US__THR_ALL_REDUCE:
        o->result = us__thr_run_all_reduce(&x, o);
        break;
    case US__THR_REDUCE_SCATTER:
        o->result = us__thr_run_reduce_scatter(&x, o);
        break;
    case US__THR_ALL_GATHER:
        o->result = us__thr_run_all_gather(&x, o);
        break;
    case US__THR_REDUCE:
    case US__THR_GATHER:
    case US__THR_SCATTER:
    case US__THR_BROADCAST:
        o->result = us__thr_run_rooted(&x, o);
        break;
    case US__THR_ALL_TO_ALL:
        o->result = us__thr_run_all_to_all(&x, o);
        break;
    case US__THR_SEND:
        o->result = us__thr_run_send(&x, o);
        break;
    case US__THR_RECV:
        o->result = us__thr_run_recv(&x, o);
        break;
    case US__THR_SENDRECV:
        o->result = us__thr_run_sendrecv(&x, o);
        break;
    case US__THR_BARRIER:
        o->result = us__thr_sync(&x);
        break;
    case US__THR_SPLIT:
        o->result = us__thr_run_split(&x, o);
        break;
    default:
        o->result = US_ERR_BACKEND;
        break;
    }
    if (o->trace) {
        char name[48];
        double b = (double)o->payload;
        if (o->kind == US__THR_BARRIER || o->kind == US__THR_SPLIT)
            us__errf(name, sizeof name, "%s", x.name);
        else if (b >= 1048576.0)
            us__errf(name, sizeof name, "%s %.1f MB", x.name, b / 1048576.0);
        else if (b >= 1024.0)
            us__errf(name, sizeof name, "%s %.1f KB", x.name, b / 1024.0);
        else
            us__errf(name, sizeof name, "%s %lld B", x.name, (long long)o->payload);
        us_trace_add(o->trace, US_STREAM_COMM, "comm", name, t0, us_trace_now_us());
    }
}

/* Runs o on lane ln, the lane marked busy meanwhile, and marks o done: called and returning with
   L->mu held, which it releases while o runs. The lane's progress thread and a rank's own thread
   (a blocking call on an idle lane, us__thr_submit) both run operations through it. */
static void us__thr_run_held(us__thr_lane *ln, us__thr_op *o) {
    us__thr_launch *L = ln->rk->L;
    ln->busy = 1;
    pthread_mutex_unlock(&L->mu);
    us__thr_execute(ln, o);
    pthread_mutex_lock(&L->mu);
    ln->busy = 0;
    o->done = 1;
    L->progress_t = us__now_s();
}

/* A progress thread: runs its lane's collectives in issue order until the launch ends. */
static void *us__thr_worker_main(void *p) {
    us__thr_lane *ln = (us__thr_lane *)p;
    us__thr_rank *rk = ln->rk;
    us__thr_launch *L = rk->L;
    pthread_mutex_lock(&L->mu);
    for (;;) {
        us__thr_op *o;
        /* (busy while the rank's own thread runs a blocking call on this lane: us__thr_submit) */
        while ((!ln->qhead || ln->busy) && !ln->shutdown) pthread_cond_wait(&ln->cv, &L->mu);
        if (!ln->qhead) break;
        o = ln->qhead;
        ln->qhead = o->qnext;
        if (!ln->qhead) ln->qtail = NULL;
        us__thr_run_held(ln, o);
        if (us__thr_gone(rk)) us__thr_wake_all(L); /* peers waiting for this rank can stop */
        /* the rank's thread wakes to a free mutex */
        pthread_mutex_unlock(&L->mu);
        pthread_cond_broadcast(&rk->done_cv);
        pthread_mutex_lock(&L->mu);
    }
    pthread_mutex_unlock(&L->mu);
    return NULL;
}

/* The rank's thread: runs fn; a failure aborts the launch. */
static void *us__thr_rank_main(void *p) {
    us__thr_rank *rk = (us__thr_rank *)p;
    us__thr_launch *L = rk->L;
    us_result r = L->fn(&rk->comm, L->arg);
    const char *why = rk->comm.err[0] ? rk->comm.err : us_result_description(r);
    pthread_mutex_lock(&L->mu);
    rk->returned = 1;
    rk->result = r;
    if (r != US_OK) {
        if (L->first_fail < 0) {
            L->first_fail = rk->rank;
            us__errf(L->fail_msg, sizeof L->fail_msg, "rank %d failed: %s", rk->rank, why);
        }
        us__thr_abort(L, "rank %d failed (it returned: %s)", rk->rank, why);
    }
    us__thr_wake_all(L);
    pthread_mutex_unlock(&L->mu);
    return NULL;
}

/* ---- the comm table: validate at issue, queue, and wait when w is NULL */
static us__thr_rank *us__thr_self(us_comm *c) { return (us__thr_rank *)c->backend; }

static us_result us__thr_invalid(us_comm *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    return US_ERR_INVALID;
}

/* g must be a live group of this launch with this rank at g->rank. */
static us_result us__thr_check_group(us_comm *c, const us_group *g, const char *name,
                                     us__thr_group **out) {
    us__thr_rank *rk = us__thr_self(c);
    us__thr_group *p = NULL;
    int ok = 0;
    if (g && g->impl) {
        pthread_mutex_lock(&rk->L->mu);
        for (p = rk->L->groups; p && p != (us__thr_group *)g->impl; p = p->next) {
        }
        ok = p && g->size == p->size && g->rank >= 0 && g->rank < p->size &&
             p->members[g->rank] == rk->rank && !p->released[g->rank];
        pthread_mutex_unlock(&rk->L->mu);
    }
    if (!ok)
        return us__thr_invalid(
            c, "%s: the group (size %d, rank %d) is not a group of this comm with rank %d in it",
            name, g ? g->size : 0, g ? g->rank : -1, rk->rank);
    *out = p;
    return US_OK;
}

static us_result us__thr_check_args(us_comm *c, const char *name, int64_t n, us_dtype dt,
                                    int reduce, us_reduce_op op) {
    if (n < 0) return us__thr_invalid(c, "%s: negative element count %lld", name, (long long)n);
    if ((int)dt < 0 || (int)dt > (int)US_F16)
        return us__thr_invalid(c, "%s: unknown dtype %d", name, (int)dt);
    if (reduce && dt != US_F32 && dt != US_F64 && dt != US_I32 && dt != US_BF16 && dt != US_F16)
        return us__thr_invalid(c, "%s: cannot reduce %s (only f32, f64, i32, bf16 and fp16)", name,
                               us_dtype_name(dt));
    if (reduce && ((int)op < 0 || (int)op > (int)US_REDUCE_MAX))
        return us__thr_invalid(c, "%s: unknown reduce op %d", name, (int)op);
    return US_OK;
}

static us_result us__thr_check_rank(us_comm *c, const char *name, const char *what, int r,
                                    const us_group *g) {
    if (r < 0 || r >= g->size)
        return us__thr_invalid(c, "%s: %s %d is not a rank of the group of %d", name, what, r,
                               g->size);
    return US_OK;
}

static us__thr_op *us__thr_op_new(us_comm *c, int kind, us__thr_group *tg, const us_group *g) {
    us__thr_op *o = (us__thr_op *)US_MALLOC(sizeof(us__thr_op));
    if (!o) {
        us__errf(c->err, sizeof c->err, "%s: out of memory for the handle", us__thr_names[kind]);
        return NULL;
    }
    memset(o, 0, sizeof *o);
    o->owner = us__thr_self(c);
    o->kind = kind;
    o->g = tg;
    o->me = g->rank;
    o->trace = c->trace;
    o->timeout_s = c->timeout_s > 0 ? c->timeout_s : 300.0;
    return o;
}

/* What an operation moves, one collective a case: payload, the data the trace names it by;
   bytes, what this rank's peers read from it (bytes_sent in the manual). S is one rank's block
   of n elements, N the group's size. Barrier and split move nothing. */
static void us__thr_traffic(us__thr_op *o) {
    const int N = o->g->size, me = o->me, at_root = o->me == o->root;
    const int64_t es = (int64_t)us__thr_dsize(o->dt), S = o->n * es;
    int j;
    switch (o->kind) {
    case US__THR_ALL_REDUCE: {
        /* the ring's reduce-scatter half sends every chunk but this rank's own, its all-gather
           half every chunk but its successor's */
        const int64_t own = us__thr_chunk_len(o->n, N, me);
        const int64_t next = us__thr_chunk_len(o->n, N, (me + 1) % N);
        o->payload = S;
        o->bytes = (2 * o->n - own - next) * es;
        break;
    }
    case US__THR_REDUCE:
        o->payload = S;
        o->bytes = at_root ? 0 : S;
        break;
    case US__THR_REDUCE_SCATTER:
    case US__THR_ALL_GATHER:
        o->payload = N * S;
        o->bytes = (N - 1) * S;
        break;
    case US__THR_GATHER:
        o->payload = N * S;
        o->bytes = at_root ? 0 : S;
        break;
    case US__THR_SCATTER:
        o->payload = N * S;
        o->bytes = at_root ? (N - 1) * S : 0;
        break;
    case US__THR_BROADCAST:
        o->payload = S;
        o->bytes = at_root ? (N - 1) * S : 0;
        break;
    case US__THR_SEND:
    case US__THR_SENDRECV: /* its receive is the peer's send */
        o->payload = S;
        o->bytes = S;
        break;
    case US__THR_RECV:
        o->payload = S;
        o->bytes = 0;
        break;
    case US__THR_ALL_TO_ALL: /* counts: [rc, rd, sc, sd][N]; its block to itself is a copy */
        o->payload = 0;
        for (j = 0; j < N; j++) o->payload += o->counts[2 * N + j] * es;
        o->bytes = o->payload - o->counts[2 * N + me] * es;
        break;
    default:
        break;
    }
}

/* The fields of an operation that moves data: buffers, count, dtype, reduce op (SUM where it
   reduces nothing), root or peer (0 where it has none); then its traffic. */
static void us__thr_op_fill(us__thr_op *o, void *dst, const void *src, int64_t n, us_dtype dt,
                            us_reduce_op op, int root) {
    o->dst = dst;
    o->src = src;
    o->n = n;
    o->dt = dt;
    o->op = op;
    o->root = root;
    us__thr_traffic(o);
}

static us_result us__thr_wait(us_comm *c, us_work *w);

/* One unfinished operation for the deadlock report: "op 7, recv from rank 1 (a dup)". */
static int us__thr_describe(char *p, size_t cap, const us__thr_op *o) {
    const char *name = us__thr_names[o->kind];
    const char *lane = o->g->lanes && o->g->lanes[o->me] ? "a dup" : "the rank's stream";
    int peer = o->root >= 0 && o->root < o->g->size ? o->g->members[o->root] : -1;
    if (o->kind == US__THR_SEND || o->kind == US__THR_RECV)
        return snprintf(p, cap, "op %lld, %s %s rank %d (%s)", (long long)o->seq, name,
                        o->kind == US__THR_SEND ? "to" : "from", peer, lane);
    if (o->kind == US__THR_SENDRECV)
        return snprintf(p, cap, "op %lld, sendrecv with rank %d (%s)", (long long)o->seq, peer,
                        lane);
    return snprintf(p, cap, "op %lld, %s on a group of %d (%s)", (long long)o->seq, name,
                    o->g->size, lane);
}

/* NCCL semantics' watchdog (caller holds L->mu): when every rank waits in a device
   synchronisation or has returned and nothing has progressed for US__THR_DEADLOCK_S, the launch
   aborts, naming each waiting rank's oldest unfinished operation. A waiting rank looks every
   US__THR_SLICE_S, and each look counts at most ten slices: a longer gap means the machine did
   not run this process's threads (a loaded machine, a sanitizer build beside other work), and
   that time is not time in which the ranks could have moved. */
static void us__thr_deadlock_check(us__thr_launch *L) {
    char msg[512];
    size_t k;
    int r;
    const double now = us__now_s(), cap = 10 * US__THR_SLICE_S, gap = now - L->check_t;
    if (L->progress_t != L->seen_t) { /* something moved since the last look */
        L->seen_t = L->progress_t;
        L->idle_s = now - L->progress_t < cap ? now - L->progress_t : cap;
    } else {
        L->idle_s += gap < cap ? gap : cap;
    }
    L->check_t = now;
    if (L->aborted || L->idle_s < US__THR_DEADLOCK_S) return;
    for (r = 0; r < L->nranks; r++)
        if (!L->ranks[r].syncing && !L->ranks[r].returned) return;
    k = (size_t)snprintf(msg, sizeof msg,
                         "deadlock: every rank waits, nothing moved for %g s:", US__THR_DEADLOCK_S);
    for (r = 0; r < L->nranks && k < sizeof msg; r++) {
        const us__thr_op *o, *oldest = NULL;
        int more = -1;
        if (!L->ranks[r].syncing) continue;
        for (o = L->ranks[r].live; o; o = o->next) /* newest first */
            if (!o->done) {
                oldest = o;
                more++;
            }
        if (!oldest) continue;
        k += (size_t)snprintf(msg + k, sizeof msg - k, " rank %d waits for ", r);
        if (k < sizeof msg) k += (size_t)us__thr_describe(msg + k, sizeof msg - k, oldest);
        if (k < sizeof msg) k += (size_t)snprintf(msg + k, sizeof msg - k, " and %d more;", more);
    }
    us__thr_abort(L, "%s", msg);
    L->deadlock = 1;
}

/* NCCL semantics: the host waits for every operation it has issued, as CUDA's implicit device
   synchronisations wait for every stream (caller holds L->mu). An abort finishes them all. */
static void us__thr_device_sync(us__thr_rank *rk) {
    us__thr_launch *L = rk->L;
    for (;;) {
        const us__thr_op *o = rk->live;
        while (o && o->done) o = o->next;
        if (!o) break;
        rk->syncing = 1;
        us__thr_deadlock_check(L);
        us__thr_wait_slice(&rk->done_cv, &L->mu, US__THR_SLICE_S);
    }
    rk->syncing = 0;
}

/* Queues o on its group's progress thread for this rank (a dup's own, else the rank's); returns
   the handle in *w or waits for it. */
static us_result us__thr_submit(us_comm *c, us__thr_op *o, us_work **w) {
    us__thr_rank *rk = us__thr_self(c);
    us__thr_launch *L = rk->L;
    us__thr_lane *ln;
    pthread_mutex_lock(&L->mu);
    ln = o->g->lanes && o->g->lanes[o->me] ? o->g->lanes[o->me] : &rk->lane;
    o->lane = ln;
    if (L->aborted) { /* fail fast */
        us__thr_aborted(c->err, sizeof c->err, us__thr_names[o->kind], L->cause);
        pthread_mutex_unlock(&L->mu);
        US_FREE(o->counts);
        US_FREE(o);
        return US_ERR_BACKEND;
    }
    o->seq = ++rk->issued;
    o->next = rk->live;
    if (rk->live) rk->live->prev = o;
    rk->live = o;
    /* A blocking call on an idle lane (nothing queued, nothing running) runs on the caller's
       thread: the progress thread would run it at once while the caller waits, and the hand-over
       costs two sleeps and two wake-ups. Not under NCCL semantics, whose watchdog reads the
       waits of the ranks' own threads. */
    if (!w && !L->nccl && !ln->qhead && !ln->busy) {
        us__thr_run_held(ln, o);
        pthread_mutex_unlock(&L->mu);
        pthread_cond_signal(&ln->cv); /* anything queued meanwhile (another thread of the rank) */
        return us__thr_wait(c, (us_work *)o);
    }
    if (ln->qtail)
        ln->qtail->qnext = o;
    else
        ln->qhead = o;
    ln->qtail = o;
    pthread_mutex_unlock(&L->mu);
    pthread_cond_signal(&ln->cv); /* after unlocking: the progress thread wakes to a free mutex */
    if (w) {
        *w = (us_work *)o;
        return US_OK;
    }
    return us__thr_wait(c, (us_work *)o);
}

static us_result us__thr_wait(us_comm *c, us_work *w) {
    us__thr_rank *rk = us__thr_self(c);
    us__thr_op *o = (us__thr_op *)w;
    us_result r;
    if (!o) return US_OK;
    if (o->owner != rk) return us__thr_invalid(c, "wait: the handle belongs to another rank");
    pthread_mutex_lock(&rk->L->mu);
    if (rk->L->nccl) us__thr_device_sync(rk);
    while (!o->done)
        pthread_cond_wait(&rk->done_cv, &rk->L->mu); /* the progress thread's waits are bounded */
    if (o->prev)
        o->prev->next = o->next;
    else
        rk->live = o->next;
    if (o->next) o->next->prev = o->prev;
    pthread_mutex_unlock(&rk->L->mu);
    r = o->result;
    if (r == US_OK)
        c->bytes_sent += o->bytes;
    else
        memcpy(c->err, o->err, sizeof c->err);
    US_FREE(o->counts);
    US_FREE(o);
    return r;
}

#define US__THR_BEGIN(KIND, G)               \
    us__thr_group *tg_ = NULL;               \
    us__thr_op *o;                           \
    const char *name_ = us__thr_names[KIND]; \
    if (w) *w = NULL;                        \
    if (us__thr_check_group(c, G, name_, &tg_) != US_OK) return US_ERR_INVALID
#define US__THR_NEW(KIND, G) \
    if (!(o = us__thr_op_new(c, KIND, tg_, G))) return US_ERR_OOM

static us_result us__thr_all_reduce(us_comm *c, us_group *g, void *buf, int64_t n, us_dtype dt,
                                    us_reduce_op op, us_work **w) {
    US__THR_BEGIN(US__THR_ALL_REDUCE, g);
    if (us__thr_check_args(c, name_, n, dt, 1, op) != US_OK) return US_ERR_INVALID;
    if (!buf && n > 0) return us__thr_invalid(c, "%s: NULL buffer", name_);
    US__THR_NEW(US__THR_ALL_REDUCE, g);
    us__thr_op_fill(o, buf, buf, n, dt, op, 0);
    return us__thr_submit(c, o, w);
}

static us_result us__thr_reduce(us_comm *c, us_group *g, void *dst, const void *src, int64_t n,
                                us_dtype dt, us_reduce_op op, int root, us_work **w) {
    US__THR_BEGIN(US__THR_REDUCE, g);
    if (us__thr_check_args(c, name_, n, dt, 1, op) != US_OK ||
        us__thr_check_rank(c, name_, "root", root, g) != US_OK)
        return US_ERR_INVALID;
    if (n > 0 && (!src || (g->rank == root && !dst)))
        return us__thr_invalid(c, "%s: NULL buffer", name_);
    US__THR_NEW(US__THR_REDUCE, g);
    us__thr_op_fill(o, dst, src, n, dt, op, root);
    return us__thr_submit(c, o, w);
}

static us_result us__thr_reduce_scatter(us_comm *c, us_group *g, void *dst, const void *src,
                                        int64_t n, us_dtype dt, us_reduce_op op, us_work **w) {
    US__THR_BEGIN(US__THR_REDUCE_SCATTER, g);
    if (us__thr_check_args(c, name_, n, dt, 1, op) != US_OK) return US_ERR_INVALID;
    if (n > 0 && (!src || !dst)) return us__thr_invalid(c, "%s: NULL buffer", name_);
    US__THR_NEW(US__THR_REDUCE_SCATTER, g);
    us__thr_op_fill(o, dst, src, n, dt, op, 0);
    return us__thr_submit(c, o, w);
}

static us_result us__thr_all_gather(us_comm *c, us_group *g, void *dst, const void *src, int64_t n,
                                    us_dtype dt, us_work **w) {
    US__THR_BEGIN(US__THR_ALL_GATHER, g);
    if (us__thr_check_args(c, name_, n, dt, 0, US_REDUCE_SUM) != US_OK) return US_ERR_INVALID;
    if (n > 0 && (!src || !dst)) return us__thr_invalid(c, "%s: NULL buffer", name_);
    US__THR_NEW(US__THR_ALL_GATHER, g);
    us__thr_op_fill(o, dst, src, n, dt, US_REDUCE_SUM, 0);
    return us__thr_submit(c, o, w);
}

static us_result us__thr_gather(us_comm *c, us_group *g, void *dst, const void *src, int64_t n,
                                us_dtype dt, int root, us_work **w) {
    US__THR_BEGIN(US__THR_GATHER, g);
    if (us__thr_check_args(c, name_, n, dt, 0, US_REDUCE_SUM) != US_OK ||
        us__thr_check_rank(c, name_, "root", root, g) != US_OK)
        return US_ERR_INVALID;
    if (n > 0 && (!src || (g->rank == root && !dst)))
        return us__thr_invalid(c, "%s: NULL buffer", name_);
    US__THR_NEW(US__THR_GATHER, g);
    us__thr_op_fill(o, dst, src, n, dt, US_REDUCE_SUM, root);
    return us__thr_submit(c, o, w);
}

static us_result us__thr_scatter(us_comm *c, us_group *g, void *dst, const void *src, int64_t n,
                                 us_dtype dt, int root, us_work **w) {
    US__THR_BEGIN(US__THR_SCATTER, g);
    if (us__thr_check_args(c, name_, n, dt, 0, US_REDUCE_SUM) != US_OK ||
        us__thr_check_rank(c, name_, "root", root, g) != US_OK)
        return US_ERR_INVALID;
    if (n > 0 && (!dst || (g->rank == root && !src)))
        return us__thr_invalid(c, "%s: NULL buffer", name_);
    US__THR_NEW(US__THR_SCATTER, g);
    us__thr_op_fill(o, dst, src, n, dt, US_REDUCE_SUM, root);
    return us__thr_submit(c, o, w);
}

static us_result us__thr_broadcast(us_comm *c, us_group *g, void *buf, int64_t n, us_dtype dt,
                                   int root, us_work **w) {
    US__THR_BEGIN(US__THR_BROADCAST, g);
    if (us__thr_check_args(c, name_, n, dt, 0, US_REDUCE_SUM) != US_OK ||
        us__thr_check_rank(c, name_, "root", root, g) != US_OK)
        return US_ERR_INVALID;
    if (n > 0 && !buf) return us__thr_invalid(c, "%s: NULL buffer", name_);
    US__THR_NEW(US__THR_BROADCAST, g);
    us__thr_op_fill(o, buf, buf, n, dt, US_REDUCE_SUM, root);
    return us__thr_submit(c, o, w);
}

static us_result us__thr_send(us_comm *c, us_group *g, const void *buf, int64_t n, us_dtype dt,
                              int peer, us_work **w) {
    US__THR_BEGIN(US__THR_SEND, g);
    if (us__thr_check_args(c, name_, n, dt, 0, US_REDUCE_SUM) != US_OK ||
        us__thr_check_rank(c, name_, "peer", peer, g) != US_OK)
        return US_ERR_INVALID;
    if (n > 0 && !buf) return us__thr_invalid(c, "%s: NULL buffer", name_);
    US__THR_NEW(US__THR_SEND, g);
    us__thr_op_fill(o, NULL, buf, n, dt, US_REDUCE_SUM, peer);
    return us__thr_submit(c, o, w);
}

/* One operation, so that under rendezvous two neighbours exchanging at once both post before
   either waits (NCCL's grouped send and receive). */
static us_result us__thr_sendrecv(us_comm *c, us_group *g, const void *sbuf, int64_t sn, int speer,
                                  void *rbuf, int64_t rn, int rpeer, us_dtype dt, us_work **w) {
    US__THR_BEGIN(US__THR_SENDRECV, g);
    if (us__thr_check_args(c, name_, sn, dt, 0, US_REDUCE_SUM) != US_OK ||
        us__thr_check_rank(c, name_, "send peer", speer, g) != US_OK ||
        us__thr_check_rank(c, name_, "receive peer", rpeer, g) != US_OK)
        return US_ERR_INVALID;
    if (rn < 0) return us__thr_invalid(c, "%s: negative receive count %lld", name_, (long long)rn);
    if ((sn > 0 && !sbuf) || (rn > 0 && !rbuf)) return us__thr_invalid(c, "%s: NULL buffer", name_);
    US__THR_NEW(US__THR_SENDRECV, g);
    us__thr_op_fill(o, rbuf, sbuf, sn, dt, US_REDUCE_SUM, speer);
    o->rn = rn;
    o->rpeer = rpeer;
    return us__thr_submit(c, o, w);
}

static us_result us__thr_recv(us_comm *c, us_group *g, void *buf, int64_t n, us_dtype dt, int peer,
                              us_work **w) {
    US__THR_BEGIN(US__THR_RECV, g);
    if (us__thr_check_args(c, name_, n, dt, 0, US_REDUCE_SUM) != US_OK ||
        us__thr_check_rank(c, name_, "peer", peer, g) != US_OK)
        return US_ERR_INVALID;
    if (n > 0 && !buf) return us__thr_invalid(c, "%s: NULL buffer", name_);
    US__THR_NEW(US__THR_RECV, g);
    us__thr_op_fill(o, buf, NULL, n, dt, US_REDUCE_SUM, peer);
    return us__thr_submit(c, o, w);
}

static us_result us__thr_all_to_all(us_comm *c, us_group *g, void *dst, const int64_t *rc,
                                    const int64_t *rd, const void *src, const int64_t *sc,
                                    const int64_t *sd, us_dtype dt, us_work **w) {
    int j, N;
    US__THR_BEGIN(US__THR_ALL_TO_ALL, g);
    N = g->size;
    if (us__thr_check_args(c, name_, 0, dt, 0, US_REDUCE_SUM) != US_OK) return US_ERR_INVALID;
    if (!rc || !rd || !sc || !sd)
        return us__thr_invalid(c, "%s: NULL count or displacement array", name_);
    for (j = 0; j < N; j++) {
        if (rc[j] < 0 || rd[j] < 0 || sc[j] < 0 || sd[j] < 0)
            return us__thr_invalid(c, "%s: negative count or displacement for peer %d", name_, j);
        if ((rc[j] > 0 && !dst) || (sc[j] > 0 && !src))
            return us__thr_invalid(c, "%s: NULL buffer", name_);
    }
    US__THR_NEW(US__THR_ALL_TO_ALL, g);
    if (!(o->counts = (int64_t *)US_MALLOC(4 * (size_t)N * sizeof(int64_t)))) {
        US_FREE(o);
        us__errf(c->err, sizeof c->err, "%s: out of memory for the counts", name_);
        return US_ERR_OOM;
    }
    memcpy(o->counts, rc, (size_t)N * sizeof(int64_t));
    memcpy(o->counts + N, rd, (size_t)N * sizeof(int64_t));
    memcpy(o->counts + 2 * N, sc, (size_t)N * sizeof(int64_t));
    memcpy(o->counts + 3 * N, sd, (size_t)N * sizeof(int64_t));
    us__thr_op_fill(o, dst, src, 0, dt, US_REDUCE_SUM, 0);
    return us__thr_submit(c, o, w);
}

static us_result us__thr_barrier(us_comm *c, us_group *g) {
    us_work **w = NULL;
    US__THR_BEGIN(US__THR_BARRIER, g);
    US__THR_NEW(US__THR_BARRIER, g);
    return us__thr_submit(c, o, w);
}

static us_result us__thr_split(us_comm *c, us_group *parent, int color, int key, us_group *out) {
    us_work **w = NULL;
    US__THR_BEGIN(US__THR_SPLIT, parent);
    if (!out) return us__thr_invalid(c, "%s: NULL output group", name_);
    US__THR_NEW(US__THR_SPLIT, parent);
    o->color = color < 0 ? -1 : color;
    o->key = key;
    o->out = out;
    return us__thr_submit(c, o, w);
}

/* Releases this rank's membership: later calls with g (or a copy) are refused. The memory stays
   until the launch ends, so collectives already queued on g, and copies of g held elsewhere,
   never see it freed under them. */
static void us__thr_group_free(us_comm *c, us_group *g) {
    us__thr_rank *rk = us__thr_self(c);
    us__thr_group *tg = NULL;
    char keep[sizeof c->err];
    if (!g || !g->impl || g->impl == (void *)rk->L->world) return; /* the world is us_launch's */
    memcpy(keep, c->err, sizeof keep);
    if (us__thr_check_group(c, g, "group_free", &tg) == US_OK) {
        pthread_mutex_lock(&rk->L->mu);
        tg->released[g->rank] = 1;
        pthread_mutex_unlock(&rk->L->mu);
    }
    memcpy(c->err, keep, sizeof keep);
    g->size = 0;
    g->rank = -1;
    g->impl = NULL;
}

/* dup: a split with one color, then a progress thread of this rank's own for the new group. */
static us_result us__thr_dup(us_comm *c, us_group *g, us_group *out) {
    us__thr_rank *rk = us__thr_self(c);
    us__thr_launch *L = rk->L;
    us__thr_group *ng;
    us__thr_lane *ln;
    us_result r;
    if (!out) return us__thr_invalid(c, "dup: NULL output group");
    if ((r = us__thr_split(c, g, 0, g ? g->rank : 0, out)) != US_OK) return r;
    ng = (us__thr_group *)out->impl;
    ln = (us__thr_lane *)US_MALLOC(sizeof *ln);
    if (ln) memset(ln, 0, sizeof *ln);
    if (!ln || pthread_cond_init(&ln->cv, NULL) != 0) {
        US_FREE(ln);
        return us__thr_invalid(c, "dup: out of memory for a progress thread"), US_ERR_OOM;
    }
    ln->rk = rk;
    pthread_mutex_lock(&L->mu);
    if (!ng->lanes &&
        (ng->lanes = (us__thr_lane **)US_MALLOC((size_t)ng->size * sizeof(us__thr_lane *))) != NULL)
        memset(ng->lanes, 0,
               (size_t)ng->size * sizeof(us__thr_lane *)); /* freed by us__thr_group_destroy */
    if (ng->lanes && pthread_create(&ln->worker, NULL, us__thr_worker_main, ln) == 0) {
        ln->worker_started = 1;
        ng->lanes[out->rank] = ln;
    }
    ln->next = rk->lanes; /* kept to the launch's end either way (us__thr_launch_free) */
    rk->lanes = ln;
    pthread_mutex_unlock(&L->mu);
    if (!ln->worker_started)
        return us__thr_invalid(c, "dup: could not start a progress thread"), US_ERR_BACKEND;
    return US_OK;
}

#undef US__THR_BEGIN
#undef US__THR_NEW

/* ---- us_launch */
static void us__thr_launch_free(us__thr_launch *L) {
    int r;
    for (r = 0; r < L->nranks; r++) {
        us__thr_rank *rk = &L->ranks[r];
        while (rk->live) {
            us__thr_op *o = rk->live;
            rk->live = o->next;
            US_FREE(o->counts);
            US_FREE(o);
        }
        while (rk->lanes) {
            us__thr_lane *ln = rk->lanes;
            rk->lanes = ln->next;
            US_FREE(ln->scratch);
            pthread_cond_destroy(&ln->cv);
            US_FREE(ln);
        }
        US_FREE(rk->lane.scratch);
        pthread_cond_destroy(&rk->lane.cv);
        pthread_cond_destroy(&rk->done_cv);
    }
    while (L->groups) {
        us__thr_group *g = L->groups;
        L->groups = g->next;
        us__thr_group_destroy(g);
    }
    pthread_mutex_destroy(&L->mu);
    US_FREE(L->ranks);
    US_FREE(L);
}

/* Rank r's communicator: the threads backend's functions (its world group is set once made). */
static void us__thr_comm_init(us__thr_launch *L, us__thr_rank *rk, int r, double timeout) {
    us_comm *c = &rk->comm;
    rk->L = L;
    rk->rank = r;
    rk->result = US_ERR_BACKEND;
    rk->lane.rk = rk;
    c->name = "threads";
    c->backend = rk;
    c->ops = NULL;
    c->world.size = L->nranks;
    c->world.rank = r;
    c->all_reduce = us__thr_all_reduce;
    c->reduce = us__thr_reduce;
    c->reduce_scatter = us__thr_reduce_scatter;
    c->all_gather = us__thr_all_gather;
    c->gather = us__thr_gather;
    c->scatter = us__thr_scatter;
    c->broadcast = us__thr_broadcast;
    c->send = us__thr_send;
    c->recv = us__thr_recv;
    c->all_to_all = us__thr_all_to_all;
    c->sendrecv = us__thr_sendrecv;
    c->barrier = us__thr_barrier;
    c->wait = us__thr_wait;
    c->split = us__thr_split;
    c->group_free = us__thr_group_free;
    c->dup = us__thr_dup;
    c->p2p_early = 1; /* a queued call waits on a thread */
    c->timeout_s = timeout;
}

/* A launch of nranks ranks, not yet started: each rank's state and communicator, and the world
   group they share. NULL, with the sentence in err, when memory (or a condition variable) runs
   out; what was made is freed. */
static us__thr_launch *us__thr_launch_new(int nranks, us_rank_fn fn, void *arg,
                                          const us_launch_config *cfg, double timeout, char *err,
                                          size_t errlen) {
    us__thr_launch *L = (us__thr_launch *)US_MALLOC(sizeof *L);
    int r, conds = 0, *world = (int *)US_MALLOC((size_t)nranks * sizeof(int));
    if (L) {
        memset(L, 0, sizeof *L);
        L->ranks = (us__thr_rank *)US_MALLOC((size_t)nranks * sizeof(us__thr_rank));
    }
    if (!L || !world || !L->ranks || pthread_mutex_init(&L->mu, NULL) != 0) {
        if (L) US_FREE(L->ranks);
        US_FREE(L);
        US_FREE(world);
        us__errf(err, errlen, "us_launch: out of memory for %d ranks", nranks);
        return NULL;
    }
    memset(L->ranks, 0, (size_t)nranks * sizeof(us__thr_rank));
    L->nranks = nranks;
    L->fn = fn;
    L->arg = arg;
    L->timeout_s = timeout;
    L->first_fail = -1;
    L->nccl = cfg ? cfg->nccl != 0 : 0;
    L->rendezvous = cfg ? cfg->p2p_rendezvous != 0 || L->nccl : 0;
    L->progress_t = us__now_s();
    for (r = 0; r < nranks; r++) {
        us__thr_rank *rk = &L->ranks[r];
        world[r] = r;
        if (pthread_cond_init(&rk->lane.cv, NULL) != 0) break;
        if (pthread_cond_init(&rk->done_cv, NULL) != 0) {
            pthread_cond_destroy(&rk->lane.cv);
            break;
        }
        conds++;
        us__thr_comm_init(L, rk, r, timeout);
    }
    pthread_mutex_lock(&L->mu);
    L->world = conds == nranks ? us__thr_group_new(L, nranks, world) : NULL;
    pthread_mutex_unlock(&L->mu);
    US_FREE(world);
    if (!L->world) {
        L->nranks = conds; /* destroy only what was created */
        us__thr_launch_free(L);
        us__errf(err, errlen, "us_launch: out of memory for %d ranks", nranks);
        return NULL;
    }
    for (r = 0; r < nranks; r++) L->ranks[r].comm.world.impl = L->world;
    return L;
}

/* Runs the ranks to their end: progress threads first, so a rank never queues work nobody will
   run, then one thread per rank. A thread that cannot start aborts the launch; the ranks from it
   on never run and count as gone. */
static void us__thr_launch_run(us__thr_launch *L) {
    const int nranks = L->nranks;
    int r, start;
    for (r = 0; r < nranks; r++) {
        if (pthread_create(&L->ranks[r].lane.worker, NULL, us__thr_worker_main,
                           &L->ranks[r].lane) != 0)
            break;
        L->ranks[r].lane.worker_started = 1;
    }
    start = r == nranks;
    for (r = 0; r < nranks && start; r++) {
        if (pthread_create(&L->ranks[r].thread, NULL, us__thr_rank_main, &L->ranks[r]) != 0) {
            start = 0;
            break;
        }
        L->ranks[r].thread_started = 1;
    }
    if (!start) {
        int k;
        pthread_mutex_lock(&L->mu);
        for (k = r; k < nranks; k++) L->ranks[k].returned = 1;
        us__thr_abort(L, "could not start the %s of rank %d",
                      L->ranks[r].lane.worker_started ? "thread" : "progress thread", r);
        pthread_mutex_unlock(&L->mu);
    }
    for (r = 0; r < nranks; r++)
        if (L->ranks[r].thread_started) pthread_join(L->ranks[r].thread, NULL);
}

/* Stops every progress thread, each rank's own and its dup'd groups', and joins them. */
static void us__thr_launch_stop_lanes(us__thr_launch *L) {
    int r;
    pthread_mutex_lock(&L->mu);
    for (r = 0; r < L->nranks; r++) {
        us__thr_lane *ln;
        L->ranks[r].lane.shutdown = 1;
        pthread_cond_broadcast(&L->ranks[r].lane.cv);
        for (ln = L->ranks[r].lanes; ln; ln = ln->next) {
            ln->shutdown = 1;
            pthread_cond_broadcast(&ln->cv);
        }
    }
    pthread_mutex_unlock(&L->mu);
    for (r = 0; r < L->nranks; r++) {
        us__thr_lane *ln;
        if (L->ranks[r].lane.worker_started) pthread_join(L->ranks[r].lane.worker, NULL);
        for (ln = L->ranks[r].lanes; ln; ln = ln->next)
            if (ln->worker_started) pthread_join(ln->worker, NULL);
    }
}

US_API us_result us_launch_ex(int nranks, us_rank_fn fn, void *arg, const us_launch_config *cfg,
                              us_result *rank_results, char *err, size_t errlen) {
    us__thr_launch *L;
    int r;
    us_result res = US_OK;
    double timeout = cfg ? cfg->timeout_s : 0.0;
    if (err && errlen) err[0] = 0;
    if (nranks < 1) {
        us__errf(err, errlen, "us_launch: nranks %d must be at least 1", nranks);
        return US_ERR_INVALID;
    }
    if (!fn) {
        us__errf(err, errlen, "us_launch: no rank function");
        return US_ERR_INVALID;
    }
    if (!(timeout >= 0)) {
        us__errf(err, errlen, "us_launch: timeout_s %g must be >= 0 (0 = 300 s)", timeout);
        return US_ERR_INVALID;
    }
    if (timeout == 0) timeout = 300.0;
    if (!(L = us__thr_launch_new(nranks, fn, arg, cfg, timeout, err, errlen))) return US_ERR_OOM;
    us__thr_launch_run(L);
    us__thr_launch_stop_lanes(L);

    for (r = 0; r < nranks; r++)
        if (rank_results) rank_results[r] = L->ranks[r].result;
    if (L->deadlock) { /* the ranks failed because of it: the cause names every rank */
        res = US_ERR_BACKEND;
        us__errf(err, errlen, "%s", L->cause);
    } else if (L->first_fail >= 0) {
        res = L->ranks[L->first_fail].result;
        us__errf(err, errlen, "%s", L->fail_msg);
    } else if (L->aborted) {
        res = US_ERR_BACKEND;
        us__errf(err, errlen, "%s", L->cause);
    }
    us__thr_launch_free(L);
    return res;
}

US_API us_result us_launch(int nranks, us_rank_fn fn, void *arg) {
    return us_launch_ex(nranks, fn, arg, NULL, NULL, NULL, 0);
}

/* NCCL backend and bootstrap */

#ifndef US__COMM_NCCL_IMPLEMENTATION_DONE
#define US__COMM_NCCL_IMPLEMENTATION_DONE

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef __cplusplus
extern "C" {
#endif
extern char **environ;
#ifdef __cplusplus
}
#endif

/* ------------------------------------------------------------------------------------ */
// >>bootstrap  torchrun / Open MPI / Slurm environments, TCP and file rendezvous, launcher
/* ------------------------------------------------------------------------------------ */
#ifdef MSG_NOSIGNAL
#define US__BOOT_NOSIG MSG_NOSIGNAL /* a peer that hung up must not kill us with SIGPIPE */
#else
#define US__BOOT_NOSIG 0
#endif
#define US__BOOT_DEFAULT_PORT 29500

static void us__boot_sleep(double s) {
    struct timespec ts;
    if (s <= 0) return;
    ts.tv_sec = (time_t)s;
    ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Milliseconds left until `deadline` for poll(), at least 0, at most `cap_s`. */
static int us__boot_ms_left(double deadline, double cap_s) {
    double left = deadline - us__now_s();
    if (left > cap_s) left = cap_s;
    return left <= 0 ? 0 : (int)(left * 1000.0) + 1;
}

/* A whole decimal integer in [lo, hi]; 0 on success, else -1 with a sentence naming `name`. */
static int us__boot_parse_int(const char *name, const char *s, long lo, long hi, int *out,
                              char *err, size_t errlen) {
    char *end;
    long v;
    errno = 0;
    v = (s && *s) ? strtol(s, &end, 10) : 0;
    if (!s || !*s || *end != '\0' || errno == ERANGE) {
        us__errf(err, errlen, "%s='%s' is not an integer", name, s ? s : "");
        return -1;
    }
    if (v < lo || v > hi) {
        us__errf(err, errlen, "%s=%ld is out of range [%ld, %ld]", name, v, lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* The first host of a Slurm node list in its simple forms: "a,b", "gpu[007-010,12]",
   "rack1-n[3-4]-ib". 0 on success. */
static int us__boot_first_host(const char *list, char *out, size_t cap) {
    size_t o = 0;
    const char *p = list;
    while (*p && *p != ',') {
        if (*p == '[') {
            p++;
            if (*p < '0' || *p > '9') return -1;
            while (*p >= '0' && *p <= '9') {
                if (o + 1 >= cap) return -1;
                out[o++] = *p++;
            }
            while (*p && *p != ']') p++;
            if (*p != ']') return -1;
            p++;
        } else {
            if (o + 1 >= cap) return -1;
            out[o++] = *p++;
        }
    }
    out[o] = '\0';
    return o ? 0 : -1;
}

US_API us_result us_dist_env_read(us_dist_env *e, char *err, size_t errlen) {
    /* one row per launcher: the variables holding rank, world, local rank, local world */
    static const char *const names[3][5] = {
        {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
        {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
         "OMPI_COMM_WORLD_LOCAL_SIZE"},
        {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
    };
    const char *const *nm = NULL;
    const char *s, *addr, *port;
    int i;
    if (!e) {
        us__errf(err, errlen, "us_dist_env_read: e is NULL");
        return US_ERR_INVALID;
    }
    memset(e, 0, sizeof *e);
    for (i = 0; i < 3 && !nm; i++)
        if (getenv(names[i][1])) nm = names[i];
    e->world_size = e->local_world_size = 1;
    e->source = "none";
    if (nm) {
        e->source = nm[0];
        if (!(s = getenv(nm[2]))) {
            us__errf(err, errlen, "%s is set (%s) but %s is not", nm[1], nm[0], nm[2]);
            return US_ERR_INVALID;
        }
        if (us__boot_parse_int(nm[2], s, 1, INT_MAX, &e->world_size, err, errlen))
            return US_ERR_INVALID;
        if (us__boot_parse_int(nm[1], getenv(nm[1]), 0, INT_MAX, &e->rank, err, errlen))
            return US_ERR_INVALID;
        if (e->rank >= e->world_size) {
            us__errf(err, errlen, "%s=%d must be below %s=%d", nm[1], e->rank, nm[2],
                     e->world_size);
            return US_ERR_INVALID;
        }
        /* single-node fallbacks when the local values are missing */
        e->local_rank = e->rank;
        e->local_world_size = e->world_size;
        if ((s = getenv(nm[3])) &&
            us__boot_parse_int(nm[3], s, 0, INT_MAX, &e->local_rank, err, errlen))
            return US_ERR_INVALID;
        if (nm == names[2]) { /* "4", "4(x2)" or "2(x3),1": the first node's count */
            const char *lname = getenv(nm[4]) ? nm[4] : "SLURM_STEP_TASKS_PER_NODE";
            char first[32];
            size_t k = 0;
            if ((s = getenv(lname)) != NULL) {
                while (s[k] >= '0' && s[k] <= '9' && k + 1 < sizeof first) {
                    first[k] = s[k];
                    k++;
                }
                first[k] = '\0';
                if (us__boot_parse_int(lname, k ? first : s, 1, INT_MAX, &e->local_world_size, err,
                                       errlen))
                    return US_ERR_INVALID;
            }
        } else if ((s = getenv(nm[4])) &&
                   us__boot_parse_int(nm[4], s, 1, INT_MAX, &e->local_world_size, err, errlen)) {
            return US_ERR_INVALID;
        }
        if (e->local_rank >= e->local_world_size) {
            us__errf(err, errlen, "%s=%d must be below the local world size %d", nm[3],
                     e->local_rank, e->local_world_size);
            return US_ERR_INVALID;
        }
        if (e->local_world_size > e->world_size) {
            us__errf(err, errlen, "the local world size %d is larger than %s=%d",
                     e->local_world_size, nm[2], e->world_size);
            return US_ERR_INVALID;
        }
    }
    addr = getenv("MASTER_ADDR");
    port = getenv("MASTER_PORT");
    if (addr && *addr) {
        if (strlen(addr) >= sizeof e->master_addr) {
            us__errf(err, errlen, "MASTER_ADDR is longer than %d characters",
                     (int)sizeof e->master_addr - 1);
            return US_ERR_INVALID;
        }
        strcpy(e->master_addr, addr);
    } else if (nm == names[2] &&
               ((s = getenv("SLURM_STEP_NODELIST")) || (s = getenv("SLURM_JOB_NODELIST")))) {
        if (us__boot_first_host(s, e->master_addr, sizeof e->master_addr)) {
            us__errf(err, errlen,
                     "cannot read the first host of the Slurm node list '%s'; set MASTER_ADDR", s);
            return US_ERR_INVALID;
        }
    } else if (e->world_size > 1) {
        us__errf(err, errlen, "a world of %d ranks (%s) needs MASTER_ADDR, the host of rank 0",
                 e->world_size, e->source);
        return US_ERR_INVALID;
    } else {
        strcpy(e->master_addr, "127.0.0.1");
    }
    e->master_port = US__BOOT_DEFAULT_PORT;
    if (port && *port &&
        us__boot_parse_int("MASTER_PORT", port, 1, 65535, &e->master_port, err, errlen))
        return US_ERR_INVALID;
    return US_OK;
}

/* ---- TCP helpers: non-blocking sockets, every wait bounded by a deadline */
static void us__boot_nonblock(int fd) {
    int fl = fcntl(fd, F_GETFL, 0);
    if (fl >= 0) fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* Moves exactly n bytes; 0 on success, else an errno (ETIMEDOUT past the deadline, EPIPE for a
   connection closed by the other side). */
static int us__boot_io(int fd, void *buf, size_t n, int sending, double deadline) {
    char *p = (char *)buf;
    while (n > 0) {
        struct pollfd pf;
        ssize_t k;
        int pr;
        pf.fd = fd;
        pf.events = (short)(sending ? POLLOUT : POLLIN);
        pf.revents = 0;
        pr = poll(&pf, 1, us__boot_ms_left(deadline, 3600));
        if (pr < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (pr == 0) return ETIMEDOUT;
        k = sending ? send(fd, p, n, US__BOOT_NOSIG) : recv(fd, p, n, 0);
        if (k < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
            return errno;
        }
        if (k == 0) return EPIPE;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static const char *us__boot_ioerr(int e) {
    return e == EPIPE ? "the connection was closed" : e == ETIMEDOUT ? "timed out" : strerror(e);
}

static void us__boot_put32(unsigned char *b, uint32_t v) {
    b[0] = (unsigned char)(v >> 24);
    b[1] = (unsigned char)(v >> 16);
    b[2] = (unsigned char)(v >> 8);
    b[3] = (unsigned char)v;
}

static uint32_t us__boot_get32(const unsigned char *b) {
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

/* Wire format (big-endian): a peer sends "USR1" rank world nbytes (16 bytes); rank 0 answers
   "USR1" nbytes (8 bytes) and the bytes, once every rank has arrived. */
static const char us__boot_magic[4] = {'U', 'S', 'R', '1'};

static us_result us__boot_tcp_root(const char *host, int port, int world, const void *bytes,
                                   size_t nbytes, double timeout_s, char *err, size_t errlen) {
    int *conn = (int *)calloc((size_t)world, sizeof(int));
    int lfd = -1, arrived = 0, r, one = 1, v6 = strchr(host, ':') != NULL;
    double deadline = us__now_s() + timeout_s;
    us_result res = US_ERR_IO;
    unsigned char hdr[16];
    if (!conn) {
        us__errf(err, errlen, "rendezvous: out of memory");
        return US_ERR_OOM;
    }
    for (r = 0; r < world; r++) conn[r] = -1;
    /* listen on every interface of the address family of HOST (a name counts as IPv4) */
    lfd = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM, 0);
    if (lfd < 0) {
        us__errf(err, errlen, "rendezvous: rank 0 could not open a socket: %s", strerror(errno));
        goto done;
    }
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (v6) {
        struct sockaddr_in6 a;
        memset(&a, 0, sizeof a);
        a.sin6_family = AF_INET6;
        a.sin6_port = htons((uint16_t)port);
        a.sin6_addr = in6addr_any;
        r = bind(lfd, (struct sockaddr *)&a, sizeof a);
    } else {
        struct sockaddr_in a;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_port = htons((uint16_t)port);
        a.sin_addr.s_addr = htonl(INADDR_ANY);
        r = bind(lfd, (struct sockaddr *)&a, sizeof a);
    }
    if (r != 0 || listen(lfd, world + 16) != 0) {
        us__errf(err, errlen, "rendezvous: rank 0 could not listen on port %d: %s", port,
                 strerror(errno));
        goto done;
    }
    us__boot_nonblock(lfd);
    while (arrived < world - 1) {
        struct pollfd pf;
        int fd, e, peer, pw, pn;
        pf.fd = lfd;
        pf.events = POLLIN;
        pf.revents = 0;
        if (us__now_s() >= deadline) {
            char missing[96];
            size_t m = 0;
            missing[0] = '\0';
            for (r = 1; r < world && m + 12 < sizeof missing; r++)
                if (conn[r] < 0)
                    m += (size_t)snprintf(missing + m, sizeof missing - m, "%s%d", m ? " " : "", r);
            us__errf(err, errlen,
                     "rendezvous: rank 0 waited %g s on port %d but only %d of %d ranks "
                     "arrived (missing: %s%s)",
                     timeout_s, port, arrived + 1, world, missing, r < world ? " ..." : "");
            goto done;
        }
        if (poll(&pf, 1, us__boot_ms_left(deadline, 1.0)) <= 0) continue;
        fd = accept(lfd, NULL, NULL);
        if (fd < 0) continue;
        us__boot_nonblock(fd);
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        e = us__boot_io(fd, hdr, 16, 0, deadline);
        if (e || memcmp(hdr, us__boot_magic, 4) != 0) {
            close(fd);
            continue;
        } /* not one of ours */
        peer = (int)us__boot_get32(hdr + 4);
        pw = (int)us__boot_get32(hdr + 8);
        pn = (int)us__boot_get32(hdr + 12);
        if (pw != world || (size_t)pn != nbytes || peer <= 0 || peer >= world) {
            us__errf(err, errlen,
                     "rendezvous: a peer says it is rank %d of %d sending %d bytes, but rank "
                     "0 has a world of %d and %zu bytes",
                     peer, pw, pn, world, nbytes);
            close(fd);
            goto done;
        }
        if (conn[peer] >= 0) {
            us__errf(err, errlen, "rendezvous: two processes claim rank %d", peer);
            close(fd);
            goto done;
        }
        conn[peer] = fd;
        arrived++;
    }
    /* everyone is here: answer (this is what makes the rendezvous a barrier) */
    memcpy(hdr, us__boot_magic, 4);
    us__boot_put32(hdr + 4, (uint32_t)nbytes);
    for (r = 1; r < world; r++) {
        int e = us__boot_io(conn[r], hdr, 8, 1, deadline + 10);
        if (!e && nbytes) e = us__boot_io(conn[r], (void *)bytes, nbytes, 1, deadline + 10);
        if (e) {
            us__errf(err, errlen, "rendezvous: rank 0 could not answer rank %d: %s", r,
                     us__boot_ioerr(e));
            goto done;
        }
    }
    res = US_OK;
done:
    for (r = 0; r < world; r++)
        if (conn[r] >= 0) close(conn[r]);
    if (lfd >= 0) close(lfd);
    free(conn);
    return res;
}

static us_result us__boot_tcp_peer(const char *host, int port, int rank, int world, void *bytes,
                                   size_t nbytes, double timeout_s, char *err, size_t errlen) {
    double deadline = us__now_s() + timeout_s, delay = 0.02;
    char portstr[16], last[160];
    unsigned char hdr[16];
    int fd = -1, e, one = 1;
    snprintf(portstr, sizeof portstr, "%d", port);
    strcpy(last, "no address");
    for (;;) { /* connect, retrying: rank 0 may not be listening yet */
        struct addrinfo hints, *ai = NULL, *a;
        int g;
        memset(&hints, 0, sizeof hints);
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        g = getaddrinfo(host, portstr, &hints, &ai);
        if (g != 0) snprintf(last, sizeof last, "%s", gai_strerror(g));
        for (a = g == 0 ? ai : NULL; a && fd < 0; a = a->ai_next) {
            int s = socket(a->ai_family, a->ai_socktype, a->ai_protocol), soerr = 0;
            socklen_t sl = sizeof soerr;
            if (s < 0) {
                snprintf(last, sizeof last, "%s", strerror(errno));
                continue;
            }
            us__boot_nonblock(s);
            if (connect(s, a->ai_addr, a->ai_addrlen) != 0) {
                struct pollfd pf;
                if (errno != EINPROGRESS) {
                    snprintf(last, sizeof last, "%s", strerror(errno));
                    close(s);
                    continue;
                }
                pf.fd = s;
                pf.events = POLLOUT;
                pf.revents = 0;
                if (poll(&pf, 1, us__boot_ms_left(deadline, 2.0)) <= 0) {
                    snprintf(last, sizeof last, "%s", strerror(ETIMEDOUT));
                    close(s);
                    continue;
                }
                if (getsockopt(s, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0) soerr = errno;
                if (soerr) {
                    snprintf(last, sizeof last, "%s", strerror(soerr));
                    close(s);
                    continue;
                }
            }
            fd = s;
        }
        if (ai) freeaddrinfo(ai);
        if (fd >= 0) break;
        if (us__now_s() + delay >= deadline) {
            us__errf(err, errlen, "rendezvous: rank %d could not reach %s:%d within %g s: %s", rank,
                     host, port, timeout_s, last);
            return US_ERR_IO;
        }
        us__boot_sleep(delay);
        delay = delay * 2 > 0.5 ? 0.5 : delay * 2;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    memcpy(hdr, us__boot_magic, 4);
    us__boot_put32(hdr + 4, (uint32_t)rank);
    us__boot_put32(hdr + 8, (uint32_t)world);
    us__boot_put32(hdr + 12, (uint32_t)nbytes);
    e = us__boot_io(fd, hdr, 16, 1, deadline);
    if (!e) e = us__boot_io(fd, hdr, 8, 0, deadline);
    if (!e &&
        (memcmp(hdr, us__boot_magic, 4) != 0 || us__boot_get32(hdr + 4) != (uint32_t)nbytes)) {
        us__errf(err, errlen,
                 "rendezvous: rank %d got an answer of the wrong kind from %s:%d (another "
                 "program on that port?)",
                 rank, host, port);
        close(fd);
        return US_ERR_IO;
    }
    if (!e && nbytes) e = us__boot_io(fd, bytes, nbytes, 0, deadline);
    close(fd);
    if (e == ETIMEDOUT) {
        us__errf(err, errlen,
                 "rendezvous: rank %d reached %s:%d but not all %d ranks arrived within %g s", rank,
                 host, port, world, timeout_s);
        return US_ERR_IO;
    }
    if (e) {
        us__errf(
            err, errlen,
            "rendezvous: rank %d lost its connection to rank 0 at %s:%d (%s); see rank 0's error",
            rank, host, port, us__boot_ioerr(e));
        return US_ERR_IO;
    }
    return US_OK;
}

/* File form: "USRVFIL1", nbytes as 8 big-endian bytes, the bytes. */
static us_result us__boot_file(const char *path, int rank, void *bytes, size_t nbytes,
                               double timeout_s, char *err, size_t errlen) {
    double deadline = us__now_s() + timeout_s;
    unsigned char hdr[16];
    size_t tl = strlen(path) + 32;
    int i;
    if (rank == 0) {
        char *tmp = (char *)malloc(tl);
        FILE *f;
        int ok;
        if (!tmp) {
            us__errf(err, errlen, "rendezvous: out of memory");
            return US_ERR_OOM;
        }
        snprintf(tmp, tl, "%s.tmp.%ld", path, (long)getpid());
        memcpy(hdr, "USRVFIL1", 8);
        for (i = 0; i < 8; i++) hdr[8 + i] = (unsigned char)((uint64_t)nbytes >> (56 - 8 * i));
        f = fopen(tmp, "wb");
        ok = f && fwrite(hdr, 1, 16, f) == 16 &&
             (nbytes == 0 || fwrite(bytes, 1, nbytes, f) == nbytes);
        if (f) {
            ok = fflush(f) == 0 && ok;
            ok = fsync(fileno(f)) == 0 && ok;
            ok = fclose(f) == 0 && ok;
        }
        ok = ok && rename(tmp, path) == 0; /* readers see the whole file or none */
        if (!ok) {
            us__errf(err, errlen, "rendezvous: rank 0 could not write %s: %s", path,
                     strerror(errno));
            remove(tmp);
        }
        free(tmp);
        return ok ? US_OK : US_ERR_IO;
    }
    for (;;) {
        FILE *f = fopen(path, "rb");
        if (f) {
            uint64_t n = 0;
            int ok = fread(hdr, 1, 16, f) == 16 && memcmp(hdr, "USRVFIL1", 8) == 0;
            for (i = 0; ok && i < 8; i++) n = n << 8 | hdr[8 + i];
            if (ok && n != (uint64_t)nbytes) {
                fclose(f);
                us__errf(err, errlen, "rendezvous: %s holds %llu bytes but rank %d expects %zu",
                         path, (unsigned long long)n, rank, nbytes);
                return US_ERR_IO;
            }
            ok = ok && (nbytes == 0 || fread(bytes, 1, nbytes, f) == nbytes);
            fclose(f);
            if (ok) return US_OK;
            us__errf(err, errlen,
                     "rendezvous: %s is not a rendezvous file (truncated or of another kind)",
                     path);
            return US_ERR_IO;
        }
        if (us__now_s() >= deadline) {
            us__errf(err, errlen, "rendezvous: rank %d found no file %s within %g s", rank, path,
                     timeout_s);
            return US_ERR_IO;
        }
        us__boot_sleep(0.01);
    }
}

US_API us_result us_rendezvous(const char *spec, int rank, int world_size, void *bytes,
                               size_t nbytes, double timeout_s, char *err, size_t errlen) {
    if (!spec) {
        us__errf(err, errlen, "rendezvous: spec is NULL");
        return US_ERR_INVALID;
    }
    if (world_size < 1 || rank < 0 || rank >= world_size) {
        us__errf(err, errlen, "rendezvous: rank %d is not a rank of a world of %d", rank,
                 world_size);
        return US_ERR_INVALID;
    }
    if (nbytes && !bytes) {
        us__errf(err, errlen, "rendezvous: bytes is NULL");
        return US_ERR_INVALID;
    }
    if (nbytes > 0x7fffffffu) {
        us__errf(err, errlen, "rendezvous: %zu bytes is more than a rendezvous carries", nbytes);
        return US_ERR_INVALID;
    }
    if (timeout_s <= 0) timeout_s = 300;
    if (!strncmp(spec, "file://", 7)) {
        if (!spec[7]) {
            us__errf(err, errlen, "rendezvous: '%s' has no path", spec);
            return US_ERR_INVALID;
        }
        return world_size == 1
                   ? US_OK
                   : us__boot_file(spec + 7, rank, bytes, nbytes, timeout_s, err, errlen);
    }
    if (!strncmp(spec, "tcp://", 6)) {
        char host[256];
        const char *h = spec + 6, *colon, *hend;
        int port;
        if (*h == '[') { /* [IPv6]:port */
            hend = strchr(h, ']');
            colon = hend ? hend + 1 : NULL;
            h++;
            if (!hend || *colon != ':') colon = NULL;
        } else {
            colon = strrchr(h, ':');
            hend = colon;
        }
        if (!colon || hend == h || (size_t)(hend - h) >= sizeof host) {
            us__errf(err, errlen, "rendezvous: '%s' is not of the form tcp://HOST:PORT", spec);
            return US_ERR_INVALID;
        }
        memcpy(host, h, (size_t)(hend - h));
        host[hend - h] = '\0';
        if (us__boot_parse_int("the rendezvous port", colon + 1, 1, 65535, &port, err, errlen))
            return US_ERR_INVALID;
        if (world_size == 1) return US_OK;
        return rank == 0 ? us__boot_tcp_root(host, port, world_size, bytes, nbytes, timeout_s, err,
                                             errlen)
                         : us__boot_tcp_peer(host, port, rank, world_size, bytes, nbytes, timeout_s,
                                             err, errlen);
    }
    us__errf(err, errlen, "rendezvous: '%s' must start with tcp:// or file://", spec);
    return US_ERR_INVALID;
}

/* ---- the launcher */
static int us__boot_free_port(void) {
    struct sockaddr_in a;
    socklen_t al = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = -1;
    if (fd < 0) return -1;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &al) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/* argv[0] with a slash as is; else the first match in PATH; else this program itself. */
static void us__boot_resolve(const char *arg0, char *out, size_t cap) {
    const char *path = getenv("PATH"), *p;
    if (strchr(arg0, '/')) {
        snprintf(out, cap, "%s", arg0);
        return;
    }
    for (p = path; p && *p;) {
        const char *q = strchr(p, ':');
        size_t len = q ? (size_t)(q - p) : strlen(p);
        size_t al = strlen(arg0);
        if (len && len + al + 2 <= cap) { /* dir + '/' + name, built by hand */
            memcpy(out, p, len);
            out[len] = '/';
            memcpy(out + len + 1, arg0, al + 1);
            if (access(out, X_OK) == 0) return;
        }
        p = q ? q + 1 : NULL;
    }
    snprintf(out, cap, "/proc/self/exe");
}

/* The environment every rank shares: ours minus the variables the launcher sets, then the
   world's (WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) from vars[0..3], each rank's
   RANK and LOCAL_RANK from vars[5] and vars[6] (written before each fork), and
   NCCL_NVLS_ENABLE=0 (vars[4]) unless ours sets it. envp holds the environment's count + 8. */
static void us__boot_rank_env(char **envp, char vars[7][64], size_t nenv, int nproc, int port) {
    static const char *const own[] = {
        "RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=", "MASTER_ADDR=", "MASTER_PORT="};
    const int nvls = getenv("NCCL_NVLS_ENABLE") != NULL;
    size_t k, m;
    int j;
    for (k = 0, m = 0; k < nenv; k++) {
        int mine = 0;
        for (j = 0; j < 6; j++)
            if (!strncmp(environ[k], own[j], strlen(own[j]))) mine = 1;
        if (!mine) envp[m++] = environ[k];
    }
    snprintf(vars[0], 64, "WORLD_SIZE=%d", nproc);
    snprintf(vars[1], 64, "LOCAL_WORLD_SIZE=%d", nproc);
    snprintf(vars[2], 64, "MASTER_ADDR=127.0.0.1");
    snprintf(vars[3], 64, "MASTER_PORT=%d", port);
    /* NVLink multicast is not allowed on the GPU machine */
    snprintf(vars[4], 64, "NCCL_NVLS_ENABLE=0");
    envp[m + 0] = vars[0];
    envp[m + 1] = vars[1];
    envp[m + 2] = vars[2];
    envp[m + 3] = vars[3];
    envp[m + 4] = vars[5];
    envp[m + 5] = vars[6];
    envp[m + 6] = nvls ? NULL : vars[4];
    envp[m + 7] = NULL;
}

/* Forks and executes exe once per rank, RANK and LOCAL_RANK written into vars[5] and vars[6]
   (which envp points at) before each fork. A failed fork kills the ranks already started and
   returns -1 with the sentence in err; else 0, pid[] holding every rank's process. */
static int us__boot_spawn(int nproc, const char *exe, char *const argv[], char **envp,
                          char vars[7][64], pid_t *pid, char *err, size_t errlen) {
    int r, j;
    fflush(NULL); /* the children must not inherit half-written output */
    for (r = 0; r < nproc; r++) {
        snprintf(vars[5], 64, "RANK=%d", r);
        snprintf(vars[6], 64, "LOCAL_RANK=%d", r);
        pid[r] = fork();
        if (pid[r] == 0) { /* the child: only async-signal-safe calls until execve */
            static const char msg[] = "launch: execve failed\n";
            execve(exe, argv, envp);
            if (write(2, msg, sizeof msg - 1) < 0) {
            }
            _exit(127);
        }
        if (pid[r] < 0) {
            us__errf(err, errlen, "launch: fork of rank %d failed: %s", r, strerror(errno));
            for (j = 0; j < r; j++) {
                kill(pid[j], SIGKILL);
                waitpid(pid[j], NULL, 0);
            }
            return -1;
        }
    }
    return 0;
}

/* What the launcher saw of its ranks' ends. */
typedef struct us__boot_watch {
    int first;  /* the first rank to fail (by a signal or a non-zero exit), -1 if none did */
    int termed; /* ranks still running when they were sent SIGTERM (0: none were) */
    int killed; /* ranks still running 5 s later, sent SIGKILL */
} us__boot_watch;

/* Waits for every rank, st[] receiving each one's wait status. After the first failure the
   others get grace_s seconds to report their own errors, then SIGTERM, then 5 s later SIGKILL. */
static void us__boot_watch_ranks(int nproc, pid_t *pid, int *st, double grace_s,
                                 us__boot_watch *w) {
    int r, alive = nproc;
    double t_fail = 0, t_term = 0;
    w->first = -1;
    w->termed = w->killed = 0;
    while (alive > 0) {
        for (r = 0; r < nproc; r++) {
            int s;
            if (pid[r] <= 0) continue;
            if (waitpid(pid[r], &s, WNOHANG) != pid[r]) continue;
            pid[r] = 0;
            st[r] = s;
            alive--;
            if (w->first < 0 && !(WIFEXITED(s) && WEXITSTATUS(s) == 0)) {
                w->first = r;
                t_fail = us__now_s();
            }
        }
        if (w->first >= 0 && alive > 0) {
            double now = us__now_s();
            int sig = 0;
            if (!w->termed && now >= t_fail + grace_s) {
                sig = SIGTERM;
                w->termed = alive;
                t_term = now;
            } else if (w->termed && !w->killed && now >= t_term + 5) {
                sig = SIGKILL;
                w->killed = alive;
            }
            for (r = 0; sig && r < nproc; r++)
                if (pid[r] > 0) kill(pid[r], sig);
        }
        if (alive > 0) us__boot_sleep(0.005);
    }
}

/* The launcher's exit code: 0 when every rank succeeded, else the first failed rank's exit code,
   or 128 + the signal that killed it, with a sentence in err. */
static int us__boot_report(const us__boot_watch *w, const int *st, double grace_s, char *err,
                           size_t errlen) {
    char more[96] = "";
    int s, ret;
    if (w->first < 0) {
        if (err && errlen) err[0] = '\0';
        return 0;
    }
    s = st[w->first];
    if (w->termed)
        snprintf(more, sizeof more, "; %d other rank%s stopped with SIGTERM%s after %g s",
                 w->termed, w->termed == 1 ? " was" : "s were", w->killed ? " and SIGKILL" : "",
                 grace_s);
    if (WIFSIGNALED(s)) {
        ret = 128 + WTERMSIG(s);
        us__errf(err, errlen, "rank %d was killed by signal %d%s", w->first, WTERMSIG(s), more);
    } else {
        ret = WIFEXITED(s) ? WEXITSTATUS(s) : 1;
        us__errf(err, errlen, "rank %d exited with code %d%s", w->first, ret, more);
    }
    return ret;
}

US_API int us_launch_procs(int nproc, char *const argv[], double grace_s, char *err,
                           size_t errlen) {
    char exe[4096], vars[7][64];
    char **envp = NULL;
    pid_t *pid = NULL;
    int *st = NULL;
    size_t nenv = 0;
    int port, ret = -1;
    us__boot_watch w;
    if (nproc < 1 || nproc > 65536 || !argv || !argv[0]) {
        us__errf(err, errlen, "launch: need 1 to 65536 processes and a program (nproc=%d)", nproc);
        return -1;
    }
    if (grace_s <= 0) grace_s = 30;
    if ((port = us__boot_free_port()) < 0) {
        us__errf(err, errlen, "launch: could not find a free port on 127.0.0.1: %s",
                 strerror(errno));
        return -1;
    }
    us__boot_resolve(argv[0], exe, sizeof exe);
    while (environ && environ[nenv]) nenv++;
    envp = (char **)malloc((nenv + 8) * sizeof *envp);
    pid = (pid_t *)calloc((size_t)nproc, sizeof *pid);
    st = (int *)calloc((size_t)nproc, sizeof *st);
    if (!envp || !pid || !st) {
        us__errf(err, errlen, "launch: out of memory");
    } else {
        us__boot_rank_env(envp, vars, nenv, nproc, port);
        if (us__boot_spawn(nproc, exe, argv, envp, vars, pid, err, errlen) == 0) {
            us__boot_watch_ranks(nproc, pid, st, grace_s, &w);
            ret = us__boot_report(&w, st, grace_s, err, errlen);
        }
    }
    free(envp);
    free(pid);
    free(st);
    return ret;
}

#ifdef ULTRASCALE_NCCL
/* ------------------------------------------------------------------------------------ */
// >>nccl  the comm seam over NCCL: comm stream, events, timeouts, abort, tracing
/* ------------------------------------------------------------------------------------ */
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <sched.h>

typedef struct us__nccl_group { /* us_group.impl: one communicator */
    ncclComm_t comm;
    cudaStream_t stream; /* where its calls run: the backend's comm stream, or a dup's own */
    int own_stream;
    int size, rank, aborted;
    struct us__nccl_group *next;
} us__nccl_group;

typedef struct us__nccl_work { /* what a us_work * points to in this backend */
    cudaEvent_t done;          /* recorded on the comm stream after the NCCL call */
    cudaEvent_t t0, t1;        /* GPU times around the call (created on first use when tracing) */
    int timed;                 /* t0/t1 were recorded for this call */
    us__nccl_group *g;
    char what[48]; /* "all_reduce 4.0 MB": for errors and the trace */
    struct us__nccl_work *next_free, *next_all;
} us__nccl_work;

typedef struct us__nccl {
    int rank, world, device;
    cudaStream_t compute, stream; /* the caller's compute stream; our communication stream */
    cudaEvent_t ready;            /* compute → comm ordering, recorded before every call */
    cudaEvent_t ref;              /* the trace's reference: GPU time of ref = host ref_us */
    double ref_us;
    void *scratch;          /* the barrier's one element */
    us__nccl_group *groups; /* every communicator held, newest first (world last) */
    us__nccl_group *world_g;
    us__nccl_work *free_list, *all;
    int failed;
    int abort_stuck; /* an abort thread never returned: leave its groups alone */
    char first_err[256];
} us__nccl;

/* ncclCommAbort releases kernels stuck on a dead peer, but it can itself block: recent NCCL
   versions synchronise the ranks of a node while reclaiming resources, and a killed rank never
   arrives (NVIDIA/nccl#863). So the aborts run on a helper thread and the caller waits for them
   at most US__NCCL_ABORT_WAIT seconds: a failure is always reported, even if the abort cannot
   finish (the process is then expected to exit; the driver reclaims the GPU). */
#define US__NCCL_ABORT_WAIT 5.0

typedef struct us__nccl_abort {
    us__nccl_group *groups;
    pthread_mutex_t mu;
    int done;
} us__nccl_abort;

static void *us__nccl_abort_main(void *arg) {
    us__nccl_abort *a = (us__nccl_abort *)arg;
    us__nccl_group *g;
    for (g = a->groups; g; g = g->next) /* newest first: split children before their parents */
        if (g->comm) ncclCommAbort(g->comm);
    pthread_mutex_lock(&a->mu);
    a->done = 1;
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

static int us__nccl_abort_all(us__nccl *nb) { /* 1 when every abort returned in time */
    us__nccl_abort *a =
        (us__nccl_abort *)calloc(1, sizeof *a); /* the thread's; leaked if it stays stuck */
    us__nccl_group *g;
    pthread_t th;
    double t0 = us__now_s();
    int done = 0;
    for (g = nb->groups; g; g = g->next) g->aborted = 1;
    if (!a) { /* no memory for the helper: abort inline and hope */
        for (g = nb->groups; g; g = g->next)
            if (g->comm) ncclCommAbort(g->comm);
        return 1;
    }
    a->groups = nb->groups;
    pthread_mutex_init(&a->mu, NULL);
    if (pthread_create(&th, NULL, us__nccl_abort_main, a) != 0) {
        us__nccl_abort_main(a);
        free(a);
        return 1;
    }
    while (!done && us__now_s() - t0 < US__NCCL_ABORT_WAIT) {
        us__boot_sleep(1e-3);
        pthread_mutex_lock(&a->mu);
        done = a->done;
        pthread_mutex_unlock(&a->mu);
    }
    if (done) {
        pthread_join(th, NULL);
        pthread_mutex_destroy(&a->mu);
        free(a);
    } else
        pthread_detach(th);
    return done;
}

/* The backend is broken: abort every communicator (a peer may wait on any of them), keep the
   first sentence for every later call. */
static us_result us__nccl_fail(us_comm *c, const char *fmt, ...) {
    us__nccl *nb = (us__nccl *)c->backend;
    va_list ap;
    if (!nb->failed) {
        int n = snprintf(nb->first_err, sizeof nb->first_err, "rank %d: ", nb->rank);
        va_start(ap, fmt);
        vsnprintf(nb->first_err + n, sizeof nb->first_err - (size_t)n, fmt, ap);
        va_end(ap);
        nb->failed = 1;
        if (!us__nccl_abort_all(nb)) {
            size_t k = strlen(nb->first_err);
            nb->abort_stuck = 1;
            snprintf(nb->first_err + k, sizeof nb->first_err - k,
                     " (ncclCommAbort still running after %g s)", US__NCCL_ABORT_WAIT);
        }
    }
    snprintf(c->err, sizeof c->err, "%s", nb->first_err);
    return US_ERR_BACKEND;
}

static us_result us__nccl_invalid(us_comm *c, const char *fmt, ...) {
    us__nccl *nb = (us__nccl *)c->backend;
    va_list ap;
    int n = snprintf(c->err, sizeof c->err, "rank %d: ", nb->rank);
    va_start(ap, fmt);
    vsnprintf(c->err + n, sizeof c->err - (size_t)n, fmt, ap);
    va_end(ap);
    return US_ERR_INVALID;
}

/* The function name of a checked expression: "ncclAllReduce(a, b, ...)" → "ncclAllReduce". */
static int us__nccl_fnlen(const char *expr) {
    const char *p = strchr(expr, '(');
    return p ? (int)(p - expr) : (int)strlen(expr);
}

/* Every CUDA and NCCL call goes through these: file, line and the library's own words. */
#define US__NCCL_CUDA(c, x)                                                                \
    do {                                                                                   \
        cudaError_t e_ = (x);                                                              \
        if (e_ != cudaSuccess)                                                             \
            return us__nccl_fail((c), "%.*s failed: %s (%s:%d); communicator aborted",     \
                                 us__nccl_fnlen(#x), #x, cudaGetErrorString(e_), __FILE__, \
                                 __LINE__);                                                \
    } while (0)
#define US__NCCL_CALL(c, x)                                                                \
    do {                                                                                   \
        ncclResult_t r_ = (x);                                                             \
        if (r_ != ncclSuccess)                                                             \
            return us__nccl_fail((c), "%.*s failed: %s: %s (%s:%d); communicator aborted", \
                                 us__nccl_fnlen(#x), #x, ncclGetErrorString(r_),           \
                                 ncclGetLastError(NULL), __FILE__, __LINE__);              \
    } while (0)

static int us__nccl_type(us_dtype dt, ncclDataType_t *t) {
    switch (dt) {
    case US_F32:
        *t = ncclFloat32;
        return 1;
    case US_BF16:
        *t = ncclBfloat16;
        return 1;
    case US_F16:
        *t = ncclFloat16;
        return 1;
    case US_I32:
        *t = ncclInt32;
        return 1;
    case US_F64:
        *t = ncclFloat64;
        return 1;
    default:
        return 0;
    }
}

static int us__nccl_op(us_reduce_op op, ncclRedOp_t *o) {
    switch (op) {
    case US_REDUCE_SUM:
        *o = ncclSum;
        return 1;
    case US_REDUCE_AVG:
        *o = ncclAvg;
        return 1;
    case US_REDUCE_MAX:
        *o = ncclMax;
        return 1;
    default:
        return 0;
    }
}

/* Checks shared by every collective: not failed, a group this rank is in, a count, a dtype. */
static us_result us__nccl_begin(us_comm *c, us_group *g, int64_t n, us_dtype dt, const char *op,
                                us__nccl_group **ng, ncclDataType_t *t) {
    us__nccl *nb = (us__nccl *)c->backend;
    if (nb->failed) {
        snprintf(c->err, sizeof c->err, "%s", nb->first_err);
        return US_ERR_BACKEND;
    }
    if (!g || !g->impl || g->size <= 0)
        return us__nccl_invalid(c, "%s on a group this rank is not part of", op);
    *ng = (us__nccl_group *)g->impl;
    if (n < 0)
        return us__nccl_invalid(c, "%s with a negative element count %lld", op, (long long)n);
    if (!us__nccl_type(dt, t))
        return us__nccl_invalid(c,
                                "%s does not support dtype %s (f32, bf16, fp16, i32 and f64 only)",
                                op, us_dtype_name(dt));
    return US_OK;
}

static us_result us__nccl_rank_ok(us_comm *c, us__nccl_group *ng, int r, const char *op,
                                  const char *role) {
    if (r < 0 || r >= ng->size)
        return us__nccl_invalid(c, "%s %s %d is not a rank of a group of %d", op, role, r,
                                ng->size);
    return US_OK;
}

/* Before the NCCL call: a handle, the comm stream waits for the compute stream's work so far,
   and (tracing) a start event. */
static us_result us__nccl_start(us_comm *c, us__nccl_group *ng, const char *op, double payload,
                                us__nccl_work **out) {
    us__nccl *nb = (us__nccl *)c->backend;
    us__nccl_work *wk = nb->free_list;
    *out = NULL;
    if (wk)
        nb->free_list = wk->next_free;
    else {
        wk = (us__nccl_work *)calloc(1, sizeof *wk);
        if (!wk) return us__nccl_invalid(c, "%s: out of host memory for a handle", op), US_ERR_OOM;
        wk->next_all = nb->all;
        nb->all = wk;
        US__NCCL_CUDA(c, cudaEventCreateWithFlags(&wk->done, cudaEventDisableTiming));
    }
    wk->g = ng;
    wk->timed = 0;
    if (payload < 1024)
        snprintf(wk->what, sizeof wk->what, "%s %.0f B", op, payload);
    else if (payload < 1048576)
        snprintf(wk->what, sizeof wk->what, "%s %.1f KB", op, payload / 1024);
    else
        snprintf(wk->what, sizeof wk->what, "%s %.1f MB", op, payload / 1048576);
    *out = wk;
    US__NCCL_CUDA(c, cudaEventRecord(nb->ready, nb->compute));
    US__NCCL_CUDA(c, cudaStreamWaitEvent(ng->stream, nb->ready, 0));
    if (c->trace) {
        if (!wk->t0) US__NCCL_CUDA(c, cudaEventCreate(&wk->t0));
        if (!wk->t1) US__NCCL_CUDA(c, cudaEventCreate(&wk->t1));
        US__NCCL_CUDA(c, cudaEventRecord(wk->t0, ng->stream));
        wk->timed = 1;
    }
    return US_OK;
}

static us_result us__nccl_wait(us_comm *c, us_work *w);

/* After the NCCL call: end and done events, the byte count, then a handle or a wait. */
static us_result us__nccl_finish(us_comm *c, us__nccl_work *wk, double bus_bytes, us_work **w) {
    if (wk->timed) US__NCCL_CUDA(c, cudaEventRecord(wk->t1, wk->g->stream));
    US__NCCL_CUDA(c, cudaEventRecord(wk->done, wk->g->stream));
    c->bytes_sent += (int64_t)bus_bytes;
    if (w) {
        *w = (us_work *)wk;
        return US_OK;
    }
    return us__nccl_wait(c, (us_work *)wk);
}

static us_result us__nccl_wait(us_comm *c, us_work *w) {
    us__nccl *nb = (us__nccl *)c->backend;
    us__nccl_work *wk = (us__nccl_work *)w;
    double t_start, timeout = c->timeout_s > 0 ? c->timeout_s : 300, nap = 5e-6;
    us_result r = US_OK;
    if (!wk) return US_OK;
    if (nb->failed) {
        snprintf(c->err, sizeof c->err, "%s", nb->first_err);
        r = US_ERR_BACKEND;
        goto release;
    }
    /* the host side first: a watchdog, so a dead peer becomes an error instead of a hang. The
       compute stream is made to wait only once the collective is known to have finished: a
       stream waiting on a collective that never ends would hang every later synchronisation
       (freeing memory, copying a loss back) with no chance to report anything. */
    t_start = us__now_s();
    for (;;) {
        ncclResult_t ar = ncclSuccess, qr;
        cudaError_t e = cudaEventQuery(wk->done);
        double waited;
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady) {
            r = us__nccl_fail(c, "%s failed on the GPU: %s; communicator aborted", wk->what,
                              cudaGetErrorString(e));
            goto release;
        }
        qr = ncclCommGetAsyncError(wk->g->comm, &ar);
        if (qr != ncclSuccess || (ar != ncclSuccess && ar != ncclInProgress)) {
            r = us__nccl_fail(c, "%s failed: %s: %s; a peer may have died; communicator aborted",
                              wk->what, ncclGetErrorString(qr != ncclSuccess ? qr : ar),
                              ncclGetLastError(wk->g->comm));
            goto release;
        }
        if ((waited = us__now_s() - t_start) > timeout) {
            r = us__nccl_fail(
                c, "%s did not complete within %g s; a peer may have died; communicator aborted",
                wk->what, timeout);
            goto release;
        }
        /* Spin for the first 20 ms, then sleep 5 µs growing to 1 ms. A sleep overshoots (the
           kernel's timer slack is 50 µs) and the GPU idles meanwhile: a collective on the critical
           path (tensor and sequence parallelism wait ~10 per layer) would lose that every time.
           Only long waits, where a millisecond is noise, are left to sleep. */
        if (waited < 0.02)
            sched_yield();
        else {
            us__boot_sleep(nap);
            if (nap < 1e-3) nap *= 1.25;
        }
    }
    {
        cudaError_t e = cudaStreamWaitEvent(nb->compute, wk->done, 0); /* order compute after it */
        if (e != cudaSuccess) {
            r = us__nccl_fail(c, "cudaStreamWaitEvent failed after %s: %s", wk->what,
                              cudaGetErrorString(e));
            goto release;
        }
    }
    if (wk->timed && c->trace) { /* GPU times → host microseconds through the reference pair */
        float ms0 = 0, ms1 = 0;
        if (cudaEventElapsedTime(&ms0, nb->ref, wk->t0) == cudaSuccess &&
            cudaEventElapsedTime(&ms1, nb->ref, wk->t1) == cudaSuccess)
            us_trace_add(c->trace, US_STREAM_COMM, "comm", wk->what, nb->ref_us + 1000.0 * ms0,
                         nb->ref_us + 1000.0 * ms1);
    }
release:
    wk->next_free = nb->free_list;
    nb->free_list = wk;
    return r;
}

/* ---- the collectives */
static us_result us__nccl_all_reduce(us_comm *c, us_group *g, void *buf, int64_t n, us_dtype dt,
                                     us_reduce_op op, us_work **w) {
    us__nccl_group *ng = NULL;
    us__nccl_work *wk = NULL;
    ncclDataType_t t = ncclFloat32;
    ncclRedOp_t o;
    double S = (double)n * (double)us_dtype_size(dt);
    us_result r = us__nccl_begin(c, g, n, dt, "all_reduce", &ng, &t);
    if (w) *w = NULL;
    if (r != US_OK) return r;
    if (!us__nccl_op(op, &o))
        return us__nccl_invalid(c, "all_reduce: unknown reduce op %d", (int)op);
    if ((r = us__nccl_start(c, ng, "all_reduce", S, &wk)) != US_OK) return r;
    US__NCCL_CALL(c, ncclAllReduce(buf, buf, (size_t)n, t, o, ng->comm, ng->stream));
    return us__nccl_finish(c, wk, 2.0 * (ng->size - 1) / ng->size * S, w);
}

static us_result us__nccl_reduce(us_comm *c, us_group *g, void *dst, const void *src, int64_t n,
                                 us_dtype dt, us_reduce_op op, int root, us_work **w) {
    us__nccl_group *ng = NULL;
    us__nccl_work *wk = NULL;
    ncclDataType_t t = ncclFloat32;
    ncclRedOp_t o;
    double S = (double)n * (double)us_dtype_size(dt);
    us_result r = us__nccl_begin(c, g, n, dt, "reduce", &ng, &t);
    if (w) *w = NULL;
    if (r != US_OK || (r = us__nccl_rank_ok(c, ng, root, "reduce", "root")) != US_OK) return r;
    if (!us__nccl_op(op, &o)) return us__nccl_invalid(c, "reduce: unknown reduce op %d", (int)op);
    if ((r = us__nccl_start(c, ng, "reduce", S, &wk)) != US_OK) return r;
    US__NCCL_CALL(c, ncclReduce(src, dst, (size_t)n, t, o, root, ng->comm, ng->stream));
    return us__nccl_finish(c, wk, ng->size > 1 ? S : 0, w);
}

static us_result us__nccl_reduce_scatter(us_comm *c, us_group *g, void *dst, const void *src,
                                         int64_t n, us_dtype dt, us_reduce_op op, us_work **w) {
    us__nccl_group *ng = NULL;
    us__nccl_work *wk = NULL;
    ncclDataType_t t = ncclFloat32;
    ncclRedOp_t o;
    double S;
    us_result r = us__nccl_begin(c, g, n, dt, "reduce_scatter", &ng, &t);
    if (w) *w = NULL;
    if (r != US_OK) return r;
    if (!us__nccl_op(op, &o))
        return us__nccl_invalid(c, "reduce_scatter: unknown reduce op %d", (int)op);
    S = (double)n * ng->size * (double)us_dtype_size(dt);
    if ((r = us__nccl_start(c, ng, "reduce_scatter", S, &wk)) != US_OK) return r;
    /* in place when dst == src + rank·n: NCCL's own in-place form */
    US__NCCL_CALL(c, ncclReduceScatter(src, dst, (size_t)n, t, o, ng->comm, ng->stream));
    return us__nccl_finish(c, wk, (double)(ng->size - 1) / ng->size * S, w);
}

static us_result us__nccl_all_gather(us_comm *c, us_group *g, void *dst, const void *src, int64_t n,
                                     us_dtype dt, us_work **w) {
    us__nccl_group *ng = NULL;
    us__nccl_work *wk = NULL;
    ncclDataType_t t = ncclFloat32;
    double S;
    us_result r = us__nccl_begin(c, g, n, dt, "all_gather", &ng, &t);
    if (w) *w = NULL;
    if (r != US_OK) return r;
    S = (double)n * ng->size * (double)us_dtype_size(dt);
    if ((r = us__nccl_start(c, ng, "all_gather", S, &wk)) != US_OK) return r;
    /* in place when src == dst + rank·n */
    US__NCCL_CALL(c, ncclAllGather(src, dst, (size_t)n, t, ng->comm, ng->stream));
    return us__nccl_finish(c, wk, (double)(ng->size - 1) / ng->size * S, w);
}

/* gather and scatter: point-to-point in one NCCL group; the root's own block is a copy */
static us_result us__nccl_gather_scatter(us_comm *c, us_group *g, void *dst, const void *src,
                                         int64_t n, us_dtype dt, int root, int scatter,
                                         us_work **w) {
    const char *op = scatter ? "scatter" : "gather";
    us__nccl_group *ng = NULL;
    us__nccl_work *wk = NULL;
    ncclDataType_t t = ncclFloat32;
    size_t es = us_dtype_size(dt), blk = (size_t)(n > 0 ? n : 0) * es;
    double S;
    int p;
    ncclResult_t nr = ncclSuccess;
    us_result r = us__nccl_begin(c, g, n, dt, op, &ng, &t);
    if (w) *w = NULL;
    if (r != US_OK || (r = us__nccl_rank_ok(c, ng, root, op, "root")) != US_OK) return r;
    S = (double)blk * ng->size;
    if ((r = us__nccl_start(c, ng, op, S, &wk)) != US_OK) return r;
    if (ng->rank == root && blk) {
        void *to = scatter ? dst : (char *)dst + (size_t)root * blk;
        const void *from = scatter ? (const char *)src + (size_t)root * blk : src;
        if (to != from)
            US__NCCL_CUDA(c, cudaMemcpyAsync(to, from, blk, cudaMemcpyDeviceToDevice, ng->stream));
    }
    if (n > 0 && ng->size > 1) {
        US__NCCL_CALL(c, ncclGroupStart());
        if (ng->rank == root) {
            for (p = 0; p < ng->size && nr == ncclSuccess; p++) {
                if (p == root) continue;
                nr = scatter ? ncclSend((const char *)src + (size_t)p * blk, (size_t)n, t, p,
                                        ng->comm, ng->stream)
                             : ncclRecv((char *)dst + (size_t)p * blk, (size_t)n, t, p, ng->comm,
                                        ng->stream);
            }
        } else {
            nr = scatter ? ncclRecv(dst, (size_t)n, t, root, ng->comm, ng->stream)
                         : ncclSend(src, (size_t)n, t, root, ng->comm, ng->stream);
        }
        {
            ncclResult_t er = ncclGroupEnd();
            if (nr == ncclSuccess) nr = er;
        } /* always close the group */
        US__NCCL_CALL(c, nr);
    }
    return us__nccl_finish(c, wk, (double)(ng->size - 1) / ng->size * S, w);
}

static us_result us__nccl_gather(us_comm *c, us_group *g, void *dst, const void *src, int64_t n,
                                 us_dtype dt, int root, us_work **w) {
    return us__nccl_gather_scatter(c, g, dst, src, n, dt, root, 0, w);
}

static us_result us__nccl_scatter(us_comm *c, us_group *g, void *dst, const void *src, int64_t n,
                                  us_dtype dt, int root, us_work **w) {
    return us__nccl_gather_scatter(c, g, dst, src, n, dt, root, 1, w);
}

static us_result us__nccl_broadcast(us_comm *c, us_group *g, void *buf, int64_t n, us_dtype dt,
                                    int root, us_work **w) {
    us__nccl_group *ng = NULL;
    us__nccl_work *wk = NULL;
    ncclDataType_t t = ncclFloat32;
    double S = (double)n * (double)us_dtype_size(dt);
    us_result r = us__nccl_begin(c, g, n, dt, "broadcast", &ng, &t);
    if (w) *w = NULL;
    if (r != US_OK || (r = us__nccl_rank_ok(c, ng, root, "broadcast", "root")) != US_OK) return r;
    if ((r = us__nccl_start(c, ng, "broadcast", S, &wk)) != US_OK) return r;
    US__NCCL_CALL(c, ncclBroadcast(buf, buf, (size_t)n, t, root, ng->comm, ng->stream));
    return us__nccl_finish(c, wk, ng->size > 1 ? S : 0, w);
}

static us_result us__nccl_p2p(us_comm *c, us_group *g, void *buf, int64_t n, us_dtype dt, int peer,
                              int sending, us_work **w) {
    const char *op = sending ? "send" : "recv";
    us__nccl_group *ng = NULL;
    us__nccl_work *wk = NULL;
    ncclDataType_t t = ncclFloat32;
    double S = (double)n * (double)us_dtype_size(dt);
    us_result r = us__nccl_begin(c, g, n, dt, op, &ng, &t);
    if (w) *w = NULL;
    if (r != US_OK || (r = us__nccl_rank_ok(c, ng, peer, op, "peer")) != US_OK) return r;
    if (peer == ng->rank) return us__nccl_invalid(c, "%s: peer %d is this rank itself", op, peer);
    if ((r = us__nccl_start(c, ng, op, S, &wk)) != US_OK) return r;
    if (sending)
        US__NCCL_CALL(c, ncclSend(buf, (size_t)n, t, peer, ng->comm, ng->stream));
    else
        US__NCCL_CALL(c, ncclRecv(buf, (size_t)n, t, peer, ng->comm, ng->stream));
    return us__nccl_finish(c, wk, sending ? S : 0, w);
}

static us_result us__nccl_send(us_comm *c, us_group *g, const void *buf, int64_t n, us_dtype dt,
                               int peer, us_work **w) {
    return us__nccl_p2p(c, g, (void *)buf, n, dt, peer, 1, w);
}

static us_result us__nccl_recv(us_comm *c, us_group *g, void *buf, int64_t n, us_dtype dt, int peer,
                               us_work **w) {
    return us__nccl_p2p(c, g, buf, n, dt, peer, 0, w);
}

/* A send and a receive in one NCCL group: neighbours exchanging at the same time (pipeline
   stages) cannot deadlock on each other's blocking send. */
static us_result us__nccl_sendrecv(us_comm *c, us_group *g, const void *sbuf, int64_t sn, int speer,
                                   void *rbuf, int64_t rn, int rpeer, us_dtype dt, us_work **w) {
    us__nccl_group *ng = NULL;
    us__nccl_work *wk = NULL;
    ncclDataType_t t = ncclFloat32;
    double S = (double)(sn + rn) * (double)us_dtype_size(dt);
    ncclResult_t nr;
    us_result r = us__nccl_begin(c, g, sn, dt, "sendrecv", &ng, &t);
    if (w) *w = NULL;
    if (r != US_OK || (r = us__nccl_rank_ok(c, ng, speer, "sendrecv", "send peer")) != US_OK ||
        (r = us__nccl_rank_ok(c, ng, rpeer, "sendrecv", "receive peer")) != US_OK)
        return r;
    if (rn < 0) return us__nccl_invalid(c, "sendrecv: negative receive count %lld", (long long)rn);
    if ((r = us__nccl_start(c, ng, "sendrecv", S, &wk)) != US_OK) return r;
    US__NCCL_CALL(c, ncclGroupStart());
    nr = ncclSend(sbuf, (size_t)sn, t, speer, ng->comm, ng->stream);
    if (nr == ncclSuccess) nr = ncclRecv(rbuf, (size_t)rn, t, rpeer, ng->comm, ng->stream);
    {
        ncclResult_t ne = ncclGroupEnd();
        if (nr == ncclSuccess) nr = ne;
    }
    US__NCCL_CALL(c, nr);
    return us__nccl_finish(c, wk, (double)sn * (double)us_dtype_size(dt), w);
}

/* EP dispatch/combine: one NCCL group of sends and receives with per-peer counts */
static us_result us__nccl_all_to_all(us_comm *c, us_group *g, void *dst, const int64_t *rc,
                                     const int64_t *rd, const void *src, const int64_t *sc,
                                     const int64_t *sd, us_dtype dt, us_work **w) {
    us__nccl_group *ng = NULL;
    us__nccl_work *wk = NULL;
    ncclDataType_t t = ncclFloat32;
    size_t es = us_dtype_size(dt);
    double S = 0, sent = 0;
    int p, me, self;
    ncclResult_t nr = ncclSuccess;
    us_result r = us__nccl_begin(c, g, 0, dt, "all_to_all", &ng, &t);
    if (w) *w = NULL;
    if (r != US_OK) return r;
    if (!rc || !rd || !sc || !sd)
        return us__nccl_invalid(c, "all_to_all: a count or displacement array is NULL");
    me = ng->rank;
    for (p = 0; p < ng->size; p++) {
        if (rc[p] < 0 || rd[p] < 0 || sc[p] < 0 || sd[p] < 0)
            return us__nccl_invalid(c, "all_to_all: negative count or displacement for peer %d", p);
        S += (double)sc[p] * (double)es;
        if (p != me) sent += (double)sc[p] * (double)es;
    }
    if (rc[me] != sc[me])
        return us__nccl_invalid(c, "all_to_all sends %lld elements to itself but expects %lld",
                                (long long)sc[me], (long long)rc[me]);
    if ((r = us__nccl_start(c, ng, "all_to_all", S, &wk)) != US_OK) return r;
    /* this rank's own block: inside the NCCL group, so it moves while the peers' blocks do (a copy
       before the group costs bandwidth: bench/RESULTS.md); alone, a device copy; in place,
       nothing */
    self =
        sc[me] > 0 && (char *)dst + (size_t)rd[me] * es != (const char *)src + (size_t)sd[me] * es;
    if (self && ng->size == 1)
        US__NCCL_CUDA(c,
                      cudaMemcpyAsync((char *)dst + (size_t)rd[me] * es,
                                      (const char *)src + (size_t)sd[me] * es, (size_t)sc[me] * es,
                                      cudaMemcpyDeviceToDevice, ng->stream));
    if (ng->size > 1) {
        US__NCCL_CALL(c, ncclGroupStart());
        for (p = 0; p < ng->size && nr == ncclSuccess; p++) {
            if (p == me && !self) continue;
            if (sc[p] > 0)
                nr = ncclSend((const char *)src + (size_t)sd[p] * es, (size_t)sc[p], t, p, ng->comm,
                              ng->stream);
            if (nr == ncclSuccess && rc[p] > 0)
                nr = ncclRecv((char *)dst + (size_t)rd[p] * es, (size_t)rc[p], t, p, ng->comm,
                              ng->stream);
        }
        {
            ncclResult_t er = ncclGroupEnd();
            if (nr == ncclSuccess) nr = er;
        }
        US__NCCL_CALL(c, nr);
    }
    return us__nccl_finish(c, wk, sent, w);
}

static us_result us__nccl_barrier(us_comm *c, us_group *g) {
    us__nccl *nb = (us__nccl *)c->backend;
    int64_t before = c->bytes_sent;
    us_result r = us__nccl_all_reduce(c, g, nb->scratch, 1, US_I32, US_REDUCE_SUM, NULL);
    c->bytes_sent = before; /* a barrier moves no payload */
    return r;
}

static us_result us__nccl_split(us_comm *c, us_group *parent, int color, int key, us_group *out) {
    us__nccl *nb = (us__nccl *)c->backend;
    us__nccl_group *pg, *ng;
    ncclComm_t nc = NULL;
    if (out) memset(out, 0, sizeof *out);
    if (nb->failed) {
        snprintf(c->err, sizeof c->err, "%s", nb->first_err);
        return US_ERR_BACKEND;
    }
    if (!out) return us__nccl_invalid(c, "split: out is NULL");
    if (!parent || !parent->impl)
        return us__nccl_invalid(c, "split of a group this rank is not part of");
    pg = (us__nccl_group *)parent->impl;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
    /* one communicator per group; ranks order by key, ties by parent rank */
    US__NCCL_CALL(c,
                  ncclCommSplit(pg->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &nc, NULL));
#else
    (void)pg;
    (void)color;
    (void)key;
    return us__nccl_invalid(c, "split needs NCCL 2.18 or later (this is %d)", NCCL_VERSION_CODE);
#endif
    if (!nc) return US_OK; /* a negative color: no group */
    ng = (us__nccl_group *)calloc(1, sizeof *ng);
    if (!ng) {
        ncclCommDestroy(nc);
        return us__nccl_invalid(c, "split: out of host memory"), US_ERR_OOM;
    }
    ng->comm = nc;
    ng->stream = nb->stream;
    ng->next = nb->groups;
    nb->groups = ng;
    US__NCCL_CALL(c, ncclCommCount(nc, &ng->size));
    US__NCCL_CALL(c, ncclCommUserRank(nc, &ng->rank));
    out->size = ng->size;
    out->rank = ng->rank;
    out->impl = ng;
    return US_OK;
}

/* A split with one color, given a stream of its own: its calls queue apart from the others'. */
static us_result us__nccl_dup(us_comm *c, us_group *g, us_group *out) {
    us__nccl_group *ng;
    int lo = 0, hi = 0;
    us_result r = us__nccl_split(c, g, 0, g ? g->rank : 0, out);
    if (r != US_OK) return r;
    ng = (us__nccl_group *)out->impl;
    US__NCCL_CUDA(c, cudaDeviceGetStreamPriorityRange(&lo, &hi));
    US__NCCL_CUDA(c, cudaStreamCreateWithPriority(&ng->stream, cudaStreamNonBlocking, hi));
    ng->own_stream = 1;
    return US_OK;
}

static void us__nccl_group_free(us_comm *c, us_group *g) {
    us__nccl *nb = (us__nccl *)c->backend;
    us__nccl_group **pp, *ng;
    if (!g || !g->impl || !nb) return;
    ng = (us__nccl_group *)g->impl;
    if (ng == nb->world_g) return; /* the world lives until us_nccl_free */
    for (pp = &nb->groups; *pp && *pp != ng; pp = &(*pp)->next) {
    }
    if (*pp) *pp = ng->next;
    if (!ng->aborted && ng->comm) ncclCommDestroy(ng->comm);
    if (ng->own_stream) {
        cudaStreamSynchronize(ng->stream);
        cudaStreamDestroy(ng->stream);
    }
    free(ng);
    memset(g, 0, sizeof *g);
}

/* Everything held by nb; `healthy` = wait for in-flight work and destroy (else abort). */
static void us__nccl_destroy(us__nccl *nb) {
    us__nccl_group *g, *gn;
    us__nccl_work *wk, *wn;
    int healthy = !nb->failed;
    if (nb->abort_stuck)
        return; /* the stuck abort still reads the groups, and the GPU would
                                      block every free: leave it all to the process's exit */
    if (healthy && nb->stream) healthy = cudaStreamSynchronize(nb->stream) == cudaSuccess;
    for (g = nb->groups; g && healthy; g = g->next)
        if (g->own_stream) healthy = cudaStreamSynchronize(g->stream) == cudaSuccess;
    for (g = nb->groups; g; g = gn) { /* newest first: groups before the world */
        gn = g->next;
        if (g->comm && !g->aborted) {
            if (healthy)
                ncclCommDestroy(g->comm);
            else
                ncclCommAbort(g->comm);
        }
        if (g->own_stream) cudaStreamDestroy(g->stream);
        free(g);
    }
    for (wk = nb->all; wk; wk = wn) {
        wn = wk->next_all;
        if (wk->done) cudaEventDestroy(wk->done);
        if (wk->t0) cudaEventDestroy(wk->t0);
        if (wk->t1) cudaEventDestroy(wk->t1);
        free(wk);
    }
    if (nb->ready) cudaEventDestroy(nb->ready);
    if (nb->ref) cudaEventDestroy(nb->ref);
    if (nb->scratch) cudaFree(nb->scratch);
    if (nb->stream) cudaStreamDestroy(nb->stream);
    free(nb);
}

/* The set-up steps of us_nccl_init: a failed CUDA or NCCL call writes its sentence into msg
   (msglen bytes), naming `rank`, and leaves the step with US_ERR_BACKEND. */
#define US__NCCL_INIT_CU(x)                                                                     \
    do {                                                                                        \
        cudaError_t ce_ = (x);                                                                  \
        if (ce_ != cudaSuccess) {                                                               \
            snprintf(msg, msglen, "rank %d: %.*s failed: %s (%s:%d)", rank, us__nccl_fnlen(#x), \
                     #x, cudaGetErrorString(ce_), __FILE__, __LINE__);                          \
            return US_ERR_BACKEND;                                                              \
        }                                                                                       \
    } while (0)
#define US__NCCL_INIT_NC(x)                                                                   \
    do {                                                                                      \
        ncclResult_t nr_ = (x);                                                               \
        if (nr_ != ncclSuccess) {                                                             \
            snprintf(msg, msglen, "rank %d: %.*s failed: %s: %s (%s:%d)", rank,               \
                     us__nccl_fnlen(#x), #x, ncclGetErrorString(nr_), ncclGetLastError(NULL), \
                     __FILE__, __LINE__);                                                     \
            return US_ERR_BACKEND;                                                            \
        }                                                                                     \
    } while (0)

/* The rendezvous of the launcher's environment (us_dist_env_read): MASTER_ADDR and MASTER_PORT,
   or the port beside it under torchrun, whose agent store holds MASTER_PORT. */
static us_result us__nccl_env_spec(char *spec, size_t cap, char *msg, size_t msglen) {
    us_dist_env env;
    int port;
    us_result r = us_dist_env_read(&env, msg, msglen);
    const char *store = getenv("TORCHELASTIC_USE_AGENT_STORE");
    if (r != US_OK) return r;
    port = env.master_port;
    if (!strcmp(env.source, "torchrun") && store && !strcmp(store, "True"))
        port = port < 65535 ? port + 1 : port - 1;
    snprintf(spec, cap, strchr(env.master_addr, ':') ? "tcp://[%s]:%d" : "tcp://%s:%d",
             env.master_addr, port);
    return US_OK;
}

/* NCCL's unique id: made by rank 0, carried to the others by the rendezvous (also a barrier).
   First the device this thread uses, the one the communicator will live on. */
static us_result us__nccl_unique_id(us__nccl *nb, const char *rendezvous, double timeout_s,
                                    ncclUniqueId *id, char *msg, size_t msglen) {
    const int rank = nb->rank;
    char spec[300];
    us_result r;
    US__NCCL_INIT_CU(cudaGetDevice(&nb->device));
    memset(id, 0, sizeof *id);
    if (rank == 0) US__NCCL_INIT_NC(ncclGetUniqueId(id));
    if (nb->world == 1) return US_OK;
    if (!rendezvous) {
        if ((r = us__nccl_env_spec(spec, sizeof spec, msg, msglen)) != US_OK) return r;
        rendezvous = spec;
    }
    return us_rendezvous(rendezvous, rank, nb->world, id, sizeof *id, timeout_s, msg, msglen);
}

/* The world communicator and what every call uses: the comm stream (non-blocking, no implicit
   sync with the legacy stream; highest priority, so collectives are not starved by a queue of
   compute kernels), the compute → comm ordering event, and the barrier's one element. */
static us_result us__nccl_world_init(us__nccl *nb, ncclUniqueId id, char *msg, size_t msglen) {
    const int rank = nb->rank;
    int lo = 0, hi = 0;
    nb->world_g = (us__nccl_group *)calloc(1, sizeof *nb->world_g);
    if (!nb->world_g) {
        snprintf(msg, msglen, "us_nccl_init: out of host memory");
        return US_ERR_OOM;
    }
    nb->groups = nb->world_g;
    US__NCCL_INIT_NC(ncclCommInitRank(&nb->world_g->comm, nb->world, id, rank));
    nb->world_g->size = nb->world;
    nb->world_g->rank = rank;
    US__NCCL_INIT_CU(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    US__NCCL_INIT_CU(cudaStreamCreateWithPriority(&nb->stream, cudaStreamNonBlocking, hi));
    nb->world_g->stream = nb->stream;
    US__NCCL_INIT_CU(cudaEventCreateWithFlags(&nb->ready, cudaEventDisableTiming));
    US__NCCL_INIT_CU(cudaMalloc(&nb->scratch, 16));
    US__NCCL_INIT_CU(cudaMemsetAsync(nb->scratch, 0, 16, nb->stream));
    return US_OK;
}

/* The trace's reference pair: ref's GPU time in host microseconds. Each sample (an event, a
   synchronize, the host clock right after) overestimates it by the wake-up latency; the
   smallest of 8 samples is the estimate. */
static us_result us__nccl_clock_samples(us__nccl *nb, cudaEvent_t probe, char *msg, size_t msglen) {
    const int rank = nb->rank;
    int k;
    US__NCCL_INIT_CU(cudaEventRecord(nb->ref, nb->stream));
    US__NCCL_INIT_CU(cudaEventSynchronize(nb->ref));
    nb->ref_us = us_trace_now_us();
    for (k = 0; k < 8; k++) {
        float ms = 0;
        double h;
        US__NCCL_INIT_CU(cudaEventRecord(probe, nb->stream));
        US__NCCL_INIT_CU(cudaEventSynchronize(probe));
        h = us_trace_now_us();
        US__NCCL_INIT_CU(cudaEventElapsedTime(&ms, nb->ref, probe));
        if (h - 1000.0 * ms < nb->ref_us) nb->ref_us = h - 1000.0 * ms;
    }
    return US_OK;
}

static us_result us__nccl_clock_ref(us__nccl *nb, char *msg, size_t msglen) {
    const int rank = nb->rank;
    cudaEvent_t probe = NULL;
    us_result r;
    US__NCCL_INIT_CU(cudaEventCreate(&nb->ref));
    US__NCCL_INIT_CU(cudaEventCreate(&probe));
    if ((r = us__nccl_clock_samples(nb, probe, msg, msglen)) != US_OK) {
        cudaEventDestroy(probe);
        return r;
    }
    US__NCCL_INIT_CU(cudaEventDestroy(probe));
    return US_OK;
}

#undef US__NCCL_INIT_CU
#undef US__NCCL_INIT_NC

/* The rank's communicator: the NCCL backend's functions over the world group. */
static void us__nccl_comm_init(us_comm *c, us__nccl *nb, us_ops *ops) {
    c->name = "nccl";
    c->backend = nb;
    c->ops = ops;
    c->world.size = nb->world;
    c->world.rank = nb->rank;
    c->world.impl = nb->world_g;
    c->all_reduce = us__nccl_all_reduce;
    c->reduce = us__nccl_reduce;
    c->reduce_scatter = us__nccl_reduce_scatter;
    c->all_gather = us__nccl_all_gather;
    c->gather = us__nccl_gather;
    c->scatter = us__nccl_scatter;
    c->broadcast = us__nccl_broadcast;
    c->send = us__nccl_send;
    c->recv = us__nccl_recv;
    c->all_to_all = us__nccl_all_to_all;
    c->sendrecv = us__nccl_sendrecv;
    c->barrier = us__nccl_barrier;
    c->wait = us__nccl_wait;
    c->split = us__nccl_split;
    c->group_free = us__nccl_group_free;
    c->dup = us__nccl_dup;
    /* a waiting call is a kernel on the GPU: the pipeline times its messages on its clock,
       except for the schedules whose channel plan idles less (us__pp_early, // >>pp) */
    c->p2p_early = 0;
}

US_API us_result us_nccl_init(us_comm *c, us_ops *ops, void *compute_stream, int rank,
                              int world_size, const char *rendezvous, double timeout_s, char *err,
                              size_t errlen) {
    us__nccl *nb = NULL;
    ncclUniqueId id;
    char msg[256];
    us_result r;
    msg[0] = '\0';
    if (!c) {
        us__errf(err, errlen, "us_nccl_init: c is NULL");
        return US_ERR_INVALID;
    }
    memset(c, 0, sizeof *c);
    c->timeout_s = timeout_s; /* the collectives' bound too (the trainer's --comm-timeout) */
    if (world_size < 1 || rank < 0 || rank >= world_size) {
        snprintf(msg, sizeof msg, "us_nccl_init: rank %d is not a rank of a world of %d", rank,
                 world_size);
        r = US_ERR_INVALID;
        goto fail;
    }
    /* no NVLink multicast on the GPU machine (override: export NCCL_NVLS_ENABLE=1) */
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    nb = (us__nccl *)calloc(1, sizeof *nb);
    if (!nb) {
        snprintf(msg, sizeof msg, "us_nccl_init: out of host memory");
        r = US_ERR_OOM;
        goto fail;
    }
    nb->rank = rank;
    nb->world = world_size;
    nb->compute = (cudaStream_t)compute_stream;
    if ((r = us__nccl_unique_id(nb, rendezvous, timeout_s, &id, msg, sizeof msg)) != US_OK ||
        (r = us__nccl_world_init(nb, id, msg, sizeof msg)) != US_OK ||
        (r = us__nccl_clock_ref(nb, msg, sizeof msg)) != US_OK)
        goto fail;
    us__nccl_comm_init(c, nb, ops);
    return US_OK;
fail:
    if (nb) { /* a half-made communicator is aborted */
        nb->failed = 1;
        us__nccl_destroy(nb);
    }
    snprintf(c->err, sizeof c->err, "%s", msg);
    us__errf(err, errlen, "%s", msg);
    return r;
}

US_API void us_nccl_free(us_comm *c) {
    if (!c || !c->backend) return;
    us__nccl_destroy((us__nccl *)c->backend);
    memset(c, 0, sizeof *c);
}
#endif /* ULTRASCALE_NCCL */

#endif /* US__COMM_NCCL_IMPLEMENTATION_DONE */

#endif /* ULTRASCALE_COMM_IMPLEMENTATION_DONE */
#endif /* ULTRASCALE_IMPLEMENTATION */
