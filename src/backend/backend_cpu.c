/* The CPU backend: the reference ops of src/kernels/cpu in fp32 (bf16 emulated by rounding), and
 * collectives through non-blocking MPI.
 *
 * Streams are real queues: a collective is started when it is enqueued and its MPI request sits in
 * its stream's queue; an op enqueued behind pending work is deferred until the queue drains, so a
 * reduce-scatter followed by the accumulation of its result runs while the caller keeps computing.
 * Queues drain when an event recorded on them is waited for, when a stream is synchronised, or
 * when a new collective is enqueued on the same stream. Compute ops run at once and poke MPI's
 * progress engine on the way, so that pending collectives advance during compute.
 *
 * An event's time is the host clock when the work before it on its stream was done: at once on a
 * stream with nothing pending, else when the queue reaches it (a stamp task), which for a collective
 * is when MPI was seen to complete it (in progress() during compute, or while a drain waited). So
 * the time between events around a collective is the collective's, as on a GPU (the trace's spans,
 * the measured communication waits). */
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/error.h"
#include "../base/log.h"
#include "../base/watchdog.h"
#include "../kernels/ops_cpu.h"
#include "backend.h"

/* ---- deferred work ---- */

typedef enum { TASK_NOP, TASK_REQUEST, TASK_CAST, TASK_ACCUMULATE, TASK_ZERO, TASK_COPY, TASK_MOVE, TASK_ROUND,
               TASK_SUM_SQUARES, TASK_SUM, TASK_CLIP_SCALE, TASK_ADAMW, TASK_QUANTIZE, TASK_DEQUANTIZE,
               TASK_SUM_PIECES, TASK_STAMP, TASK_FP8_AMAX, TASK_FP8_ENCODE, TASK_FP8_UNPACK } task_kind;

typedef struct task {
    task_kind kind;
    MPI_Request request;
    void *dst, *m, *v, *working;
    const void *src;
    float *out;
    fsdp_dtype dst_t, src_t;
    size_t n;
    int pieces, accumulate; /* quantize, dequantize, sum_pieces: n is the piece's element count */
    size_t valid;
    float max_norm;
    fsdp_adamw_args adamw;
    const float *scale;
    struct fsdp_event *event; /* TASK_STAMP: the event it times, NULL once re-recorded or destroyed */
    /* TASK_FP8_*: the codes written (and W^T's), the weight's scales, the amax parts' stride and the
     * weight's place in its unit */
    uint8_t *codes, *codes_t;
    int stride;
    fsdp_fp8_matrix matrix;
    struct task *next;
} task;

struct fsdp_stream {
    char name[32];
    task *head, *tail;
    long long enqueued, completed; /* task counts: an event is a position in this sequence */
    fsdp_stream *next_stream;
};

struct fsdp_event {
    fsdp_stream *stream;
    long long position;
    double time;
    task *stamp; /* the pending stamp task that will set `time`, or NULL */
};

struct fsdp_comm {
    MPI_Comm comm;
    int rank, size;
};

typedef struct {
    fsdp_stream *streams; /* every stream, for progress */
    int round;            /* emulate bf16 in act/grad tensors */
} cpu_context;

static cpu_context *context_of(fsdp_backend *be) { return (cpu_context *)be->context; }

static int rounds(fsdp_backend *be, fsdp_dtype t) { (void)be; return t == FSDP_BF16; }

static void round_if(fsdp_dtype t, void *x, size_t n) {
    if (t == FSDP_BF16) cpu_round_bf16((float *)x, n);
}

static void run_task(task *t, const fsdp_stream *s) {
    switch (t->kind) {
    case TASK_NOP: break;
    case TASK_REQUEST: {
        char what[64];
        snprintf(what, sizeof what, "a collective on stream '%s'", s->name);
        fsdp_mpi_wait(&t->request, what);
        break;
    }
    case TASK_CAST:
        if (t->dst != t->src) memcpy(t->dst, t->src, t->n * sizeof(float));
        round_if(t->dst_t, t->dst, t->n);
        break;
    case TASK_ACCUMULATE: {
        float *d = t->dst;
        const float *s = t->src;
        #pragma omp parallel for schedule(static)
        for (size_t i = 0; i < t->n; i++) d[i] += s[i];
        round_if(t->dst_t, d, t->n);
        break;
    }
    case TASK_ZERO: memset(t->dst, 0, t->n); break;
    case TASK_COPY: memcpy(t->dst, t->src, t->n); break;
    case TASK_MOVE: memmove(t->dst, t->src, t->n); break;
    case TASK_ROUND: cpu_round_bf16(t->dst, t->n); break;
    case TASK_SUM_SQUARES: *t->out += (float)cpu_sum_squares(t->src, t->n); break;
    case TASK_SUM: *t->out += (float)cpu_sum(t->src, t->n); break;
    case TASK_CLIP_SCALE: {
        /* torch.nn.utils.clip_grad_norm_: coefficient max_norm / (norm + 1e-6), clamped to 1. */
        float coef = t->max_norm / (sqrtf(*(const float *)t->src) + 1e-6f);
        *t->out = (t->max_norm > 0.0f && coef < 1.0f) ? coef : 1.0f;
        break;
    }
    case TASK_ADAMW:
        cpu_adamw(t->dst, t->src, t->m, t->v, t->n, &t->adamw, *t->scale, t->working, t->dst_t == FSDP_BF16,
                  t->working && t->src_t == FSDP_BF16);
        break;
    case TASK_QUANTIZE: cpu_quantize_pieces(t->dst, t->dst_t, t->src, t->n, t->pieces, t->valid); break;
    case TASK_DEQUANTIZE: cpu_dequantize_pieces(t->dst, t->dst_t, t->src, t->src_t, t->n, t->pieces); break;
    case TASK_SUM_PIECES:
        cpu_sum_pieces(t->dst, t->dst_t, t->src, t->src_t, t->n, t->pieces, t->accumulate);
        break;
    case TASK_STAMP:
        if (t->event) t->event->time = MPI_Wtime(), t->event->stamp = NULL;
        break;
    case TASK_FP8_AMAX: cpu_fp8_amax(t->out, t->src, 1, (int)t->n, 0, 0); break;
    case TASK_FP8_ENCODE:
        cpu_fp8_scales_of_parts(t->out, t->scale, t->pieces, t->stride, FSDP_E4M3);
        cpu_fp8_cast(t->codes, t->out + 1, t->out, NULL, t->src, 1, (int)t->n, 0, 0, FSDP_E4M3, 0, t->out + 2);
        break;
    case TASK_FP8_UNPACK:
        cpu_fp8_unpack(t->codes, t->codes_t, t->dst, t->dst_t == FSDP_BF16, t->src,
                       fsdp_dtype_piece_bytes(t->src_t, t->n), t->n, &t->matrix, t->src_t, t->scale[0]);
        break;
    }
}

/* Runs (or waits for) the queue's tasks up to and including sequence position `upto`, and the stamps
 * (and completed collectives) right behind them: a queue is never left holding only those, which
 * would defer the next op that finds it empty. */
static void drain_to(fsdp_stream *s, long long upto) {
    while (s->head && (s->completed < upto || s->head->kind == TASK_STAMP || s->head->kind == TASK_NOP)) {
        task *t = s->head;
        s->head = t->next;
        if (!s->head) s->tail = NULL;
        run_task(t, s);
        s->completed++;
        free(t);
    }
}

static void drain(fsdp_stream *s) { drain_to(s, s->enqueued); }

static void push(fsdp_stream *s, task *t) {
    t->next = NULL;
    if (s->tail)
        s->tail->next = t;
    else
        s->head = t;
    s->tail = t;
    s->enqueued++;
}

static task *new_task(task_kind kind) {
    task *t = fsdp_xcalloc(1, sizeof *t, "a CPU stream task");
    t->kind = kind;
    return t;
}

/* An op on stream s: at once when nothing is pending there, else behind the pending work. */
static void submit(fsdp_stream *s, task *t) {
    if (!s->head) {
        run_task(t, s);
        s->enqueued++;
        s->completed++;
        free(t);
    } else {
        push(s, t);
    }
}

/* Lets MPI advance pending collectives while compute runs. A completed collective is dequeued with
 * the stamps right behind it, which thereby get the time it was seen to complete; any other task
 * waits for the next drain, as before. */
static void progress(fsdp_backend *be) {
    for (fsdp_stream *s = context_of(be)->streams; s; s = s->next_stream) {
        while (s->head) {
            task *t = s->head;
            if (t->kind == TASK_REQUEST) {
                int done = 0;
                FSDP_CHECK_MPI(MPI_Test(&t->request, &done, MPI_STATUS_IGNORE));
                if (!done) break;
                t->kind = TASK_NOP;
            } else if (t->kind != TASK_NOP && t->kind != TASK_STAMP) {
                break;
            }
            drain_to(s, s->completed + 1);
        }
    }
    /* Model ops run on the compute stream: behind what is queued there, as on a GPU (a collective the
     * engine issued on it, such as the FP8 weights' amax exchange, and the copies queued behind it). */
    drain(be->compute);
}

/* ---- memory ---- */

static size_t cpu_dtype_size(fsdp_backend *be, fsdp_dtype t) { (void)be; return fsdp_device_dtype_size(FSDP_DEVICE_CPU, t); }

typedef struct {
    size_t bytes;
    size_t pad[3];
} alloc_header; /* keeps 32-byte alignment of the payload within a 256-byte aligned block */

static double gib(size_t bytes) { return (double)bytes / (double)(1u << 30); }

/* The memory limit is a test cap (emulating a smaller device): reserved_bytes may not pass it. */
static void *cpu_alloc(fsdp_backend *be, size_t bytes, const char *what) {
    if (be->memory_limit && fsdp_device_alloc_size(FSDP_DEVICE_CPU, bytes) > be->memory_limit - be->reserved_bytes) {
        char detail[160], held[32], limit[32];
        snprintf(detail, sizeof detail, "%s held by fsdp.c of the --memory-limit %s",
                 fsdp_bytes_text((double)be->reserved_bytes, held), fsdp_bytes_text((double)be->memory_limit, limit));
        return fsdp_backend_out_of_memory(be, bytes, what, detail);
    }
    size_t total = ((bytes + 256 + 255) / 256) * 256;
    char *base = aligned_alloc(256, total);
    if (!base) fsdp_fatal("out of host memory allocating %.2f GiB for %s", gib(bytes), what);
    ((alloc_header *)base)->bytes = bytes;
    be->reserved_bytes += fsdp_device_alloc_size(FSDP_DEVICE_CPU, bytes);
    if (be->reserved_bytes > be->max_reserved_bytes) be->max_reserved_bytes = be->reserved_bytes;
    memset(base + 256, 0, bytes);
    return base + 256;
}

static void cpu_free(fsdp_backend *be, void *ptr) {
    if (!ptr) return;
    char *base = (char *)ptr - 256;
    be->reserved_bytes -= fsdp_device_alloc_size(FSDP_DEVICE_CPU, ((alloc_header *)base)->bytes);
    free(base);
}

static void cpu_memory_info(fsdp_backend *be, size_t *free_bytes, size_t *total_bytes) {
    *total_bytes = be->memory_limit;
    *free_bytes = be->memory_limit > be->reserved_bytes ? be->memory_limit - be->reserved_bytes : 0;
}

/* The CPU ops take their scratch from the host heap, outside reserved_bytes. */
static void cpu_reserve_scratch(fsdp_backend *be, size_t bytes) { (void)be, (void)bytes; }

/* Host memory is reachable by MPI as it is. */
static void *cpu_alloc_shared(fsdp_backend *be, fsdp_comm *c, size_t bytes, const char *what) {
    (void)c;
    return cpu_alloc(be, bytes, what);
}

static void *cpu_alloc_host(fsdp_backend *be, size_t bytes, const char *what) { (void)be; return fsdp_xmalloc(bytes, what); }
static void cpu_free_host(fsdp_backend *be, void *ptr) { (void)be; free(ptr); }

static void copy_task(fsdp_stream *s, void *dst, const void *src, size_t bytes) {
    task *t = new_task(TASK_COPY);
    t->dst = dst, t->src = src, t->n = bytes;
    submit(s, t);
}
/* After a deferred out-of-memory (fsdp_oom) the buffer that was refused is NULL; the set-up that
 * copies into it only has to reach the point where the ranks agree. */
static int refused(fsdp_backend *be, int null_pointer) {
    if (!null_pointer) return 0;
    if (be->oom.failures) return 1;
    fsdp_fatal("internal error: a copy or zeroing of a NULL pointer");
}

static void cpu_copy(fsdp_backend *be, void *dst, const void *src, size_t bytes, fsdp_stream *s) {
    if (refused(be, !dst || !src)) return;
    copy_task(s, dst, src, bytes);
}

static void cpu_zero(fsdp_backend *be, void *dst, size_t bytes, fsdp_stream *s) {
    if (refused(be, !dst)) return;
    task *t = new_task(TASK_ZERO);
    t->dst = dst, t->n = bytes;
    submit(s, t);
}

/* ---- streams and events ---- */

static fsdp_stream *cpu_stream_create(fsdp_backend *be, const char *name) {
    fsdp_stream *s = fsdp_xcalloc(1, sizeof *s, "a stream");
    snprintf(s->name, sizeof s->name, "%s", name);
    s->next_stream = context_of(be)->streams;
    context_of(be)->streams = s;
    return s;
}

static void cpu_stream_destroy(fsdp_backend *be, fsdp_stream *s) {
    if (!s) return;
    drain(s);
    fsdp_stream **p = &context_of(be)->streams;
    while (*p && *p != s) p = &(*p)->next_stream;
    if (*p) *p = s->next_stream;
    free(s);
}

static fsdp_event *cpu_event_create(fsdp_backend *be, int timing) {
    (void)be, (void)timing;
    return fsdp_xcalloc(1, sizeof(fsdp_event), "an event");
}
static void cpu_event_destroy(fsdp_backend *be, fsdp_event *e) {
    (void)be;
    if (e && e->stamp) e->stamp->event = NULL;
    free(e);
}

static void cpu_event_record(fsdp_backend *be, fsdp_event *e, fsdp_stream *s) {
    (void)be;
    if (e->stamp) e->stamp->event = NULL; /* the last recording's stamp no longer times it */
    e->stamp = NULL;
    e->stream = s;
    e->time = MPI_Wtime();
    if (s->head) { /* behind pending work: timed when the queue reaches it */
        task *t = new_task(TASK_STAMP);
        t->event = e;
        e->stamp = t;
        push(s, t);
    }
    e->position = s->enqueued;
}

static void cpu_event_synchronize(fsdp_backend *be, fsdp_event *e) {
    (void)be;
    if (e->stream) drain_to(e->stream, e->position);
}

static void cpu_stream_wait_event(fsdp_backend *be, fsdp_stream *s, fsdp_event *e) {
    (void)s;
    /* Later work on s may only run once e's position is reached; reaching it now is simplest. */
    cpu_event_synchronize(be, e);
}

static void cpu_stream_synchronize(fsdp_backend *be, fsdp_stream *s) { (void)be; drain(s); }

static float cpu_event_elapsed_ms(fsdp_backend *be, fsdp_event *a, fsdp_event *b) {
    (void)be;
    return (float)((b->time - a->time) * 1e3);
}

/* ---- collectives ---- */

static fsdp_comm *cpu_comm_create(fsdp_backend *be, MPI_Comm comm, const char *name, int flags) {
    (void)be, (void)name, (void)flags; /* MPI on the CPU has no copy engines to offer */
    fsdp_comm *c = fsdp_xcalloc(1, sizeof *c, "a communicator");
    FSDP_CHECK_MPI(MPI_Comm_dup(comm, &c->comm));
    FSDP_CHECK_MPI(MPI_Comm_rank(c->comm, &c->rank));
    FSDP_CHECK_MPI(MPI_Comm_size(c->comm, &c->size));
    return c;
}

static void cpu_comm_destroy(fsdp_backend *be, fsdp_comm *c) {
    (void)be;
    if (!c) return;
    FSDP_CHECK_MPI(MPI_Comm_free(&c->comm));
    free(c);
}

static int mpi_count(size_t count) {
    if (count > (size_t)INT_MAX) fsdp_fatal("a CPU collective of %zu elements exceeds MPI's int count", count);
    return (int)count;
}

/* What one rank's `count` elements of t are on the wire: plain values travel as floats (the CPU
 * keeps bf16 in fp32 storage, so bf16 sums are fp32 sums rounded afterwards), a piece of a blockwise
 * dtype as its bytes. `bytes` is the stride between ranks' parts of a buffer. */
typedef struct {
    MPI_Datatype type;
    int count;
    size_t bytes;
} wire;

static wire wire_of(fsdp_dtype t, size_t count) {
    const size_t bytes = fsdp_device_piece_bytes(FSDP_DEVICE_CPU, t, count);
    if (fsdp_dtype_blockwise(t)) return (wire){MPI_BYTE, mpi_count(bytes), bytes};
    FSDP_ASSERT(fsdp_device_dtype_size(FSDP_DEVICE_CPU, t) == sizeof(float));
    return (wire){MPI_FLOAT, mpi_count(count), bytes};
}

/* Blockwise dtypes carry codes and scales, which MPI cannot add. */
static void require_summable(fsdp_dtype t, const char *call) {
    if (fsdp_dtype_blockwise(t))
        fsdp_fatal("internal error: %s of %s, a blockwise dtype (only all_gather and all_to_all move those)", call,
                   fsdp_dtype_name(t));
}

static void start_request(fsdp_stream *s, MPI_Request req) {
    task *t = new_task(TASK_REQUEST);
    t->request = req;
    push(s, t);
}

static void round_task(fsdp_stream *s, void *dst, size_t n) {
    task *t = new_task(TASK_ROUND);
    t->dst = dst, t->n = n;
    push(s, t);
}

static void cpu_all_gather(fsdp_backend *be, fsdp_comm *c, const void *send, void *recv, size_t count,
                           fsdp_dtype t, fsdp_stream *s) {
    (void)be;
    drain(s);
    const wire w = wire_of(t, count);
    const void *sb = (const char *)recv + (size_t)c->rank * w.bytes == send ? MPI_IN_PLACE : send;
    MPI_Request req;
    FSDP_CHECK_MPI(MPI_Iallgather(sb, w.count, w.type, recv, w.count, w.type, c->comm, &req));
    start_request(s, req);
}

static void cpu_reduce_scatter(fsdp_backend *be, fsdp_comm *c, const void *send, void *recv, size_t count,
                               fsdp_dtype t, fsdp_stream *s) {
    (void)be;
    require_summable(t, "reduce_scatter");
    drain(s);
    const wire w = wire_of(t, count);
    MPI_Request req;
    int in_place = (const char *)send + (size_t)c->rank * w.bytes == recv;
    if (in_place) {
        /* MPI's in-place reduce-scatter leaves the result at the start of the buffer; move it to
         * this rank's slice afterwards (the rest of send is dead after a reduce-scatter). */
        FSDP_CHECK_MPI(MPI_Ireduce_scatter_block(MPI_IN_PLACE, (void *)send, w.count, w.type, MPI_SUM, c->comm, &req));
        start_request(s, req);
        if (c->rank != 0) {
            task *mv = new_task(TASK_MOVE);
            mv->dst = recv, mv->src = send, mv->n = w.bytes;
            push(s, mv);
        }
    } else {
        FSDP_CHECK_MPI(MPI_Ireduce_scatter_block(send, recv, w.count, w.type, MPI_SUM, c->comm, &req));
        start_request(s, req);
    }
    if (t == FSDP_BF16) round_task(s, recv, count);
}

static void cpu_all_to_all(fsdp_backend *be, fsdp_comm *c, const void *send, void *recv, size_t count,
                           fsdp_dtype t, fsdp_stream *s) {
    (void)be;
    drain(s);
    const wire w = wire_of(t, count);
    MPI_Request req;
    FSDP_CHECK_MPI(MPI_Ialltoall(send, w.count, w.type, recv, w.count, w.type, c->comm, &req));
    start_request(s, req);
}

static void cpu_all_reduce(fsdp_backend *be, fsdp_comm *c, void *buf, size_t count, fsdp_dtype t, fsdp_stream *s) {
    (void)be;
    require_summable(t, "all_reduce");
    drain(s);
    const wire w = wire_of(t, count);
    MPI_Request req;
    FSDP_CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, buf, w.count, w.type, MPI_SUM, c->comm, &req));
    start_request(s, req);
    if (t == FSDP_BF16) round_task(s, buf, count);
}

/* ---- utilities on explicit streams ---- */

static void cpu_cast(fsdp_backend *be, void *dst, fsdp_dtype dt, const void *src, fsdp_dtype st, size_t n,
                     fsdp_stream *s) {
    (void)be, (void)st;
    task *t = new_task(TASK_CAST);
    t->dst = dst, t->src = src, t->dst_t = dt, t->n = n;
    submit(s, t);
}

static void cpu_accumulate(fsdp_backend *be, void *dst, fsdp_dtype dt, const void *src, fsdp_dtype st, size_t n,
                           fsdp_stream *s) {
    (void)be, (void)st;
    task *t = new_task(TASK_ACCUMULATE);
    t->dst = dst, t->src = src, t->dst_t = dt, t->n = n;
    submit(s, t);
}

static void cpu_sum_squares_op(fsdp_backend *be, float *out, const void *x, fsdp_dtype dt, size_t n, fsdp_stream *s) {
    (void)be, (void)dt;
    task *t = new_task(TASK_SUM_SQUARES);
    t->out = out, t->src = x, t->n = n;
    submit(s, t);
}

static void cpu_sum_op(fsdp_backend *be, float *out, const float *x, size_t n, fsdp_stream *s) {
    (void)be;
    task *t = new_task(TASK_SUM);
    t->out = out, t->src = x, t->n = n;
    submit(s, t);
}

static void cpu_clip_scale(fsdp_backend *be, float *scale, const float *sumsq, float max_norm, fsdp_stream *s) {
    (void)be;
    task *t = new_task(TASK_CLIP_SCALE);
    t->out = scale, t->src = sumsq, t->max_norm = max_norm;
    submit(s, t);
}

static void cpu_adamw_op(fsdp_backend *be, void *param, const void *grad, void *m, void *v, fsdp_dtype master_t,
                         size_t n, const fsdp_adamw_args *a, const float *grad_scale, void *working,
                         fsdp_dtype working_t, fsdp_stream *s) {
    (void)be;
    task *t = new_task(TASK_ADAMW);
    t->dst = param, t->src = grad, t->m = m, t->v = v, t->n = n, t->adamw = *a, t->scale = grad_scale;
    t->working = working, t->dst_t = master_t, t->src_t = working_t;
    submit(s, t);
}

/* Quantization ops: the plain side of each is fp32 storage (bf16 emulated), the other pieces of
 * codes and scales (src/kernels/cpu/quantize.c). Queued like the other utilities, so that a
 * dequantize of a gather's result waits for the gather. */
static void require_plain(fsdp_dtype t, const char *op, const char *side) {
    if (fsdp_dtype_blockwise(t))
        fsdp_fatal("internal error: %s with a blockwise %s (%s); that side must be fp32 or bf16", op, side,
                   fsdp_dtype_name(t));
}

static void cpu_quantize_op(fsdp_backend *be, void *dst, fsdp_dtype dt, const void *src, fsdp_dtype st, size_t count,
                            int pieces, size_t valid, fsdp_stream *s) {
    (void)be;
    require_plain(st, "quantize", "source");
    task *t = new_task(TASK_QUANTIZE);
    t->dst = dst, t->src = src, t->dst_t = dt, t->src_t = st, t->n = count, t->pieces = pieces, t->valid = valid;
    submit(s, t);
}

static void cpu_dequantize_op(fsdp_backend *be, void *dst, fsdp_dtype dt, const void *src, fsdp_dtype st,
                              size_t count, int pieces, fsdp_stream *s) {
    (void)be;
    require_plain(dt, "dequantize", "destination");
    task *t = new_task(TASK_DEQUANTIZE);
    t->dst = dst, t->src = src, t->dst_t = dt, t->src_t = st, t->n = count, t->pieces = pieces;
    submit(s, t);
}

static void cpu_sum_pieces_op(fsdp_backend *be, void *dst, fsdp_dtype dt, const void *src, fsdp_dtype st,
                              size_t count, int pieces, int accumulate, fsdp_stream *s) {
    (void)be;
    require_plain(dt, "sum_pieces", "destination");
    task *t = new_task(TASK_SUM_PIECES);
    t->dst = dst, t->src = src, t->dst_t = dt, t->src_t = st, t->n = count, t->pieces = pieces;
    t->accumulate = accumulate;
    submit(s, t);
}

/* ---- model ops: fp32 reference, outputs rounded when their dtype is emulated bf16 ---- */

#define ACT(be) ((be)->act_dtype)
#define GRAD(be) ((be)->grad_dtype)

static void cpu_add_rows_op(fsdp_backend *be, float *dst, int64_t window_start, int64_t window_len,
                            const fsdp_row_set *sets, int nsets, const void *values, int N, int C, fsdp_stream *s) {
    (void)be;
    drain(s);
    cpu_add_rows(dst, window_start, window_len, sets, nsets, values, N, C);
}

static void cpu_embedding_forward_op(fsdp_backend *be, void *out, const int32_t *tokens, const void *wte,
                                  const void *wpe, int pos_offset, int N, int T, int C) {
    progress(be);
    cpu_embedding_forward(out, tokens, wte, wpe, pos_offset, N, T, C);
    round_if(ACT(be), out, (size_t)N * C);
}

static void cpu_embedding_backward_op(fsdp_backend *be, void *dwte, void *dwpe, const void *dout,
                                      const int32_t *tokens, int padding_idx, int pos_offset, int N, int T,
                                      int C) {
    progress(be);
    cpu_embedding_backward(dwte, dwpe, dout, tokens, padding_idx, pos_offset, N, T, C);
    /* Rounding a whole embedding-gradient matrix per micro-batch would dominate CPU bf16 runs;
     * the rows touched are rounded instead. */
    if (rounds(be, GRAD(be))) {
        for (int n = 0; n < N; n++) {
            cpu_round_bf16((float *)dwte + (size_t)tokens[n] * C, (size_t)C);
            if (dwpe) cpu_round_bf16((float *)dwpe + (size_t)(pos_offset + n % T) * C, (size_t)C);
        }
    }
}

/* An op's report of its output's amax (out_amax of backend.h), over the values as stored. */
static void report_amax(float *amax, const void *out, int N, int C) {
    if (amax) cpu_fp8_amax(amax, out, N, C, 0, 0);
}

static void cpu_rmsnorm_forward_op(fsdp_backend *be, void *out, float *rstd, const void *inp, const void *w, int N,
                                   int C, float eps, float *out_amax) {
    progress(be);
    cpu_rmsnorm_forward(out, rstd, inp, w, N, C, eps);
    round_if(ACT(be), out, (size_t)N * C);
    report_amax(out_amax, out, N, C);
}

static void cpu_rmsnorm_backward_op(fsdp_backend *be, void *dinp, void *dw, const void *dout, const void *inp,
                                    const void *w, const float *rstd, int N, int C, float *dinp_amax) {
    progress(be);
    cpu_rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
    round_if(ACT(be), dinp, (size_t)N * C);
    round_if(GRAD(be), dw, (size_t)C);
    report_amax(dinp_amax, dinp, N, C);
}

static void cpu_layernorm_forward_op(fsdp_backend *be, void *out, float *mean, float *rstd, const void *inp,
                                     const void *w, const void *b, int N, int C, float eps, float *out_amax) {
    progress(be);
    cpu_layernorm_forward(out, mean, rstd, inp, w, b, N, C, eps);
    round_if(ACT(be), out, (size_t)N * C);
    report_amax(out_amax, out, N, C);
}

static void cpu_layernorm_backward_op(fsdp_backend *be, void *dinp, void *dw, void *db, const void *dout,
                                      const void *inp, const void *w, const float *mean, const float *rstd, int N,
                                      int C, float *dinp_amax) {
    progress(be);
    cpu_layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    round_if(ACT(be), dinp, (size_t)N * C);
    round_if(GRAD(be), dw, (size_t)C);
    round_if(GRAD(be), db, (size_t)C);
    report_amax(dinp_amax, dinp, N, C);
}

static void cpu_matmul_forward_op(fsdp_backend *be, void *out, const void *inp, const void *w, const void *bias,
                                  const void *residual, int N, int C, int OC, int relu) {
    progress(be);
    cpu_matmul_forward(out, inp, w, bias, residual, N, C, OC, relu);
    round_if(ACT(be), out, (size_t)N * OC);
}

static void cpu_matmul_backward_op(fsdp_backend *be, void *dinp, void *dw, void *db, const void *dout,
                                   const void *inp, const void *w, int N, int C, int OC) {
    progress(be);
    cpu_matmul_backward(dinp, dw, db, dout, inp, w, N, C, OC);
    if (dinp) round_if(ACT(be), dinp, (size_t)N * C);
    round_if(GRAD(be), dw, (size_t)OC * C);
    if (db) round_if(GRAD(be), db, (size_t)OC);
}

/* FP8 products emulated (src/kernels/cpu/fp8.c): the same casts and scales as on a GPU, then fp32 sums. */
static void check_fp8_shape(const char *op, int N, int C, int OC) {
    if (!fsdp_fp8_shape_ok(N, C, OC))
        fsdp_fatal("internal error: %s of N=%d, C=%d, OC=%d, which are not all multiples of %d", op, N, C, OC,
                   FSDP_FP8_DIM_MULTIPLE);
}

static void cpu_matmul_forward_fp8_op(fsdp_backend *be, void *out, const void *inp, const void *w, const void *bias,
                                      const void *residual, int N, int C, int OC, int relu, const fsdp_fp8_recipe *r,
                                      fsdp_fp8_amax amax, const fsdp_fp8_weight *w8) {
    progress(be);
    check_fp8_shape("matmul_forward_fp8", N, C, OC);
    cpu_fp8_matmul_forward(out, inp, w, bias, residual, N, C, OC, relu, r, amax, w8);
    round_if(ACT(be), out, (size_t)N * OC);
}

static void cpu_matmul_backward_fp8_op(fsdp_backend *be, void *dinp, void *dw, void *db, const void *dout,
                                       const void *inp, const void *w, int N, int C, int OC,
                                       const fsdp_fp8_recipe *r, fsdp_fp8_amax amax, const fsdp_fp8_weight *w8) {
    progress(be);
    check_fp8_shape("matmul_backward_fp8", N, C, OC);
    cpu_fp8_matmul_backward(dinp, dw, db, dout, inp, w, N, C, OC, r, amax, w8);
    if (dinp) round_if(ACT(be), dinp, (size_t)N * C);
    round_if(GRAD(be), dw, (size_t)OC * C);
    if (db) round_if(GRAD(be), db, (size_t)OC);
}

/* Product weights cast once per gather (src/kernels/cpu/fp8.c), queued on their stream like the
 * quantization ops: an unpack behind a gather waits for it. */
static void cpu_fp8_amax_op(fsdp_backend *be, float *amax, const void *x, fsdp_dtype t, size_t n, fsdp_stream *s) {
    (void)be;
    require_plain(t, "fp8_amax", "source");
    if (n > (size_t)INT_MAX) fsdp_fatal("internal error: an FP8 amax of %zu elements", n);
    task *k = new_task(TASK_FP8_AMAX);
    k->out = amax, k->src = x, k->n = n;
    submit(s, k);
}

static void cpu_fp8_encode_op(fsdp_backend *be, uint8_t *codes, float *scales, const float *amax_parts, int parts,
                              int stride, const void *x, fsdp_dtype t, size_t n, fsdp_stream *s) {
    (void)be;
    require_plain(t, "fp8_encode", "source");
    if (n > (size_t)INT_MAX) fsdp_fatal("internal error: an FP8 encode of %zu elements", n);
    task *k = new_task(TASK_FP8_ENCODE);
    k->codes = codes, k->out = scales, k->scale = amax_parts, k->pieces = parts, k->stride = stride, k->src = x;
    k->n = n;
    submit(s, k);
}

static void cpu_fp8_unpack_op(fsdp_backend *be, uint8_t *codes, uint8_t *codes_t, void *unit, fsdp_dtype unit_t,
                              const void *pieces, fsdp_dtype t, size_t count, const fsdp_fp8_matrix *m,
                              const float *scales, fsdp_stream *s) {
    (void)be;
    require_plain(unit_t, "fp8_unpack", "destination");
    task *k = new_task(TASK_FP8_UNPACK);
    k->codes = codes, k->codes_t = codes_t, k->dst = unit, k->dst_t = unit_t, k->src = pieces, k->src_t = t;
    k->n = count, k->matrix = *m, k->scale = scales;
    submit(s, k);
}

static void cpu_relu_backward_op(fsdp_backend *be, void *d, const void *out, size_t n) {
    progress(be);
    cpu_relu_backward(d, out, n);
}

static void cpu_rope_forward_op(fsdp_backend *be, void *qkv, const float *cs, int B, int T, int Hq, int Hkv, int D) {
    progress(be);
    cpu_rope_forward(qkv, cs, B, T, Hq, Hkv, D);
    round_if(ACT(be), qkv, (size_t)B * T * (Hq + 2 * Hkv) * D);
}

static void cpu_rope_backward_op(fsdp_backend *be, void *dqkv, const float *cs, int B, int T, int Hq, int Hkv, int D,
                                 float *dqkv_amax) {
    progress(be);
    cpu_rope_backward(dqkv, cs, B, T, Hq, Hkv, D);
    round_if(ACT(be), dqkv, (size_t)B * T * (Hq + 2 * Hkv) * D);
    report_amax(dqkv_amax, dqkv, B * T, (Hq + 2 * Hkv) * D);
}

static void cpu_attention_forward_op(fsdp_backend *be, fsdp_attn mode, void *out, float *lse, void *probs,
                                     const void *qkv, int B, int T, int Hq, int Hkv, int D, int window,
                                     const fsdp_dropout *drop) {
    progress(be);
    cpu_attention_forward_window(out, lse, mode == FSDP_ATTN_EAGER ? probs : NULL, qkv, B, T, Hq, Hkv, D, window,
                                 drop);
    round_if(ACT(be), out, (size_t)B * T * Hq * D);
    if (mode == FSDP_ATTN_EAGER && probs) round_if(ACT(be), probs, (size_t)B * Hq * T * T);
}

/* Every mode is the same exact attention here. */
static const char *cpu_attention_unsupported(fsdp_backend *be, fsdp_attn mode, int T, int D, int window,
                                             double dropout) {
    (void)be, (void)mode, (void)T, (void)D, (void)window, (void)dropout;
    return NULL;
}

static void cpu_attention_backward_op(fsdp_backend *be, fsdp_attn mode, void *dqkv, const void *dout,
                                      const void *qkv, const void *out, const float *lse, const void *probs, int B,
                                      int T, int Hq, int Hkv, int D, int window, const fsdp_dropout *drop) {
    progress(be);
    cpu_attention_backward_window(dqkv, dout, qkv, out, lse, mode == FSDP_ATTN_EAGER ? probs : NULL, B, T, Hq, Hkv,
                                  D, window, drop);
    round_if(ACT(be), dqkv, (size_t)B * T * (Hq + 2 * Hkv) * D);
}

static void cpu_qk_norm_forward_op(fsdp_backend *be, void *out, float *rstd, const void *inp, const void *wq,
                                   const void *wk, int N, int Hq, int Hkv, int D, float eps) {
    progress(be);
    cpu_qk_norm_forward(out, rstd, inp, wq, wk, N, Hq, Hkv, D, eps);
    round_if(ACT(be), out, (size_t)N * (Hq + 2 * Hkv) * D);
}

static void cpu_qk_norm_backward_op(fsdp_backend *be, void *dinp, void *dwq, void *dwk, const void *dout,
                                    const void *inp, const void *wq, const void *wk, const float *rstd, int N, int Hq,
                                    int Hkv, int D) {
    progress(be);
    cpu_qk_norm_backward(dinp, dwq, dwk, dout, inp, wq, wk, rstd, N, Hq, Hkv, D);
    round_if(ACT(be), dinp, (size_t)N * (Hq + 2 * Hkv) * D);
    round_if(GRAD(be), dwq, (size_t)D);
    round_if(GRAD(be), dwk, (size_t)D);
}

static void cpu_kv_cache_append_op(fsdp_backend *be, void *k_cache, void *v_cache, const void *qkv, int N, int pos0,
                                   int cap, int Hq, int Hkv, int D) {
    progress(be);
    cpu_kv_cache_append(k_cache, v_cache, qkv, N, pos0, cap, Hq, Hkv, D); /* copies: already rounded */
}

static void cpu_attention_decode_op(fsdp_backend *be, void *out, const void *qkv, const void *k_cache,
                                    const void *v_cache, int N, int pos0, int cap, int Hq, int Hkv, int D,
                                    int window) {
    progress(be);
    cpu_attention_decode_window(out, qkv, k_cache, v_cache, N, pos0, cap, Hq, Hkv, D, window);
    round_if(ACT(be), out, (size_t)N * Hq * D);
}

/* The fused residual-dropout ops are defined as their parts in sequence, each output rounded to
 * the act dtype where it is stored: what the CUDA kernels compute in one pass. */
static void cpu_residual_dropout_forward_op(fsdp_backend *be, void *out, const void *residual, const void *x, int N,
                                            int T, int C, const fsdp_dropout *drop) {
    progress(be);
    cpu_residual_dropout_forward(out, residual, x, N, T, C, drop);
    round_if(ACT(be), out, (size_t)N * C);
}

static void cpu_dropout_backward_op(fsdp_backend *be, void *dx, const void *dout, int N, int T, int C,
                                    const fsdp_dropout *drop) {
    progress(be);
    cpu_dropout_backward(dx, dout, N, T, C, drop);
    round_if(ACT(be), dx, (size_t)N * C);
}

static void cpu_rmsnorm_dropout_forward_op(fsdp_backend *be, void *res_out, void *out, float *rstd,
                                           const void *residual, const void *x, const void *w, int N, int T, int C,
                                           float eps, const fsdp_dropout *drop, float *out_amax) {
    cpu_residual_dropout_forward_op(be, res_out, residual, x, N, T, C, drop);
    cpu_rmsnorm_forward_op(be, out, rstd, res_out, w, N, C, eps, out_amax);
}

static void cpu_layernorm_dropout_forward_op(fsdp_backend *be, void *res_out, void *out, float *mean, float *rstd,
                                             const void *residual, const void *x, const void *w, const void *b, int N,
                                             int T, int C, float eps, const fsdp_dropout *drop, float *out_amax) {
    cpu_residual_dropout_forward_op(be, res_out, residual, x, N, T, C, drop);
    cpu_layernorm_forward_op(be, out, mean, rstd, res_out, w, b, N, C, eps, out_amax);
}

static void cpu_rmsnorm_dropout_backward_op(fsdp_backend *be, void *dinp, void *dx, void *dw, const void *dout,
                                            const void *inp, const void *w, const float *rstd, int N, int T, int C,
                                            const fsdp_dropout *drop, float *dx_amax) {
    cpu_rmsnorm_backward_op(be, dinp, dw, dout, inp, w, rstd, N, C, NULL);
    cpu_dropout_backward_op(be, dx, dinp, N, T, C, drop);
    report_amax(dx_amax, dx, N, C);
}

static void cpu_layernorm_dropout_backward_op(fsdp_backend *be, void *dinp, void *dx, void *dw, void *db,
                                              const void *dout, const void *inp, const void *w, const float *mean,
                                              const float *rstd, int N, int T, int C, const fsdp_dropout *drop,
                                              float *dx_amax) {
    cpu_layernorm_backward_op(be, dinp, dw, db, dout, inp, w, mean, rstd, N, C, NULL);
    cpu_dropout_backward_op(be, dx, dinp, N, T, C, drop);
    report_amax(dx_amax, dx, N, C);
}

static void cpu_swiglu_forward_op(fsdp_backend *be, void *out, const void *gateup, int N, int F, float *out_amax) {
    progress(be);
    cpu_swiglu_forward(out, gateup, N, F);
    round_if(ACT(be), out, (size_t)N * F);
    report_amax(out_amax, out, N, F);
}

static void cpu_swiglu_backward_op(fsdp_backend *be, void *dgateup, const void *dout, const void *gateup, int N,
                                   int F, float *dgateup_amax) {
    progress(be);
    cpu_swiglu_backward(dgateup, dout, gateup, N, F);
    round_if(ACT(be), dgateup, (size_t)N * 2 * F);
    report_amax(dgateup_amax, dgateup, N, 2 * F);
}

static void cpu_cross_entropy_op(fsdp_backend *be, float *losses, void *logits, const int32_t *targets, int n, int V,
                                 float grad_scale) {
    progress(be);
    cpu_cross_entropy(losses, logits, targets, n, V, grad_scale);
    round_if(ACT(be), logits, (size_t)n * V);
}

static void cpu_destroy(fsdp_backend *be) {
    cpu_context *im = context_of(be);
    while (im->streams) cpu_stream_destroy(be, im->streams);
    free(im);
    free(be);
}

/* ---- the interface tables ---- */

static const fsdp_backend_runtime cpu_runtime = {
    .dtype_size = cpu_dtype_size,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .memory_info = cpu_memory_info,
    .reserve_scratch = cpu_reserve_scratch,
    .alloc_host = cpu_alloc_host,
    .free_host = cpu_free_host,
    .copy_h2d = cpu_copy,
    .copy_d2h = cpu_copy,
    .zero = cpu_zero,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .stream_wait_event = cpu_stream_wait_event,
    .event_synchronize = cpu_event_synchronize,
    .stream_synchronize = cpu_stream_synchronize,
    .event_elapsed_ms = cpu_event_elapsed_ms,
    .destroy = cpu_destroy,
};

static const fsdp_backend_collectives cpu_collectives = {
    .comm_create = cpu_comm_create,
    .comm_destroy = cpu_comm_destroy,
    .alloc_shared = cpu_alloc_shared,
    .all_gather = cpu_all_gather,
    .reduce_scatter = cpu_reduce_scatter,
    .all_reduce = cpu_all_reduce,
    .all_to_all = cpu_all_to_all,
};

static const fsdp_backend_ops cpu_ops = {
    .cast = cpu_cast,
    .accumulate = cpu_accumulate,
    .quantize = cpu_quantize_op,
    .dequantize = cpu_dequantize_op,
    .sum_pieces = cpu_sum_pieces_op,
    .sum_squares = cpu_sum_squares_op,
    .sum = cpu_sum_op,
    .clip_scale = cpu_clip_scale,
    .add_rows = cpu_add_rows_op,
    .adamw = cpu_adamw_op,
    .embedding_forward = cpu_embedding_forward_op,
    .embedding_backward = cpu_embedding_backward_op,
    .rmsnorm_forward = cpu_rmsnorm_forward_op,
    .rmsnorm_backward = cpu_rmsnorm_backward_op,
    .layernorm_forward = cpu_layernorm_forward_op,
    .layernorm_backward = cpu_layernorm_backward_op,
    .matmul_forward = cpu_matmul_forward_op,
    .matmul_backward = cpu_matmul_backward_op,
    .matmul_forward_fp8 = cpu_matmul_forward_fp8_op,
    .matmul_backward_fp8 = cpu_matmul_backward_fp8_op,
    .fp8_amax = cpu_fp8_amax_op,
    .fp8_encode = cpu_fp8_encode_op,
    .fp8_unpack = cpu_fp8_unpack_op,
    .relu_backward = cpu_relu_backward_op,
    .rope_forward = cpu_rope_forward_op,
    .rope_backward = cpu_rope_backward_op,
    .attention_forward = cpu_attention_forward_op,
    .attention_unsupported = cpu_attention_unsupported,
    .attention_backward = cpu_attention_backward_op,
    .qk_norm_forward = cpu_qk_norm_forward_op,
    .qk_norm_backward = cpu_qk_norm_backward_op,
    .kv_cache_append = cpu_kv_cache_append_op,
    .attention_decode = cpu_attention_decode_op,
    .residual_dropout_forward = cpu_residual_dropout_forward_op,
    .dropout_backward = cpu_dropout_backward_op,
    .rmsnorm_dropout_forward = cpu_rmsnorm_dropout_forward_op,
    .layernorm_dropout_forward = cpu_layernorm_dropout_forward_op,
    .rmsnorm_dropout_backward = cpu_rmsnorm_dropout_backward_op,
    .layernorm_dropout_backward = cpu_layernorm_dropout_backward_op,
    .swiglu_forward = cpu_swiglu_forward_op,
    .swiglu_backward = cpu_swiglu_backward_op,
    .cross_entropy = cpu_cross_entropy_op,
};

fsdp_backend *fsdp_backend_cpu_create(const fsdp_backend_options *opts, fsdp_err *err) {
    (void)err;
    fsdp_backend *be = fsdp_xcalloc(1, sizeof *be, "the CPU backend");
    cpu_context *im = fsdp_xcalloc(1, sizeof *im, "the CPU backend");
    be->context = im;
    be->name = "cpu";
    snprintf(be->device_name, sizeof be->device_name, "CPU (%d OpenMP threads)", omp_get_max_threads());
    be->act_dtype = opts->act_dtype;
    be->grad_dtype = opts->grad_dtype;
    be->emulated_bf16 = 1;
    be->fp8_products = 1; /* emulated */
    be->kind = FSDP_DEVICE_CPU;
    be->memory_limit = opts->memory_limit;

    be->runtime = &cpu_runtime;
    be->coll = &cpu_collectives;
    be->ops = &cpu_ops;

    be->compute = cpu_stream_create(be, "compute");
    return be;
}
