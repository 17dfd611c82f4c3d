/* --init-from (hf_import.h): the model of a Hugging Face directory or a checkpoint, and its weights
 * read shard by shard. */
#include "hf_import.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "../base/agree.h"
#include "../base/env.h"
#include "../base/log.h"
#include "../base/watchdog.h"
#include "../io/checkpoint.h"
#include "../io/hf_config.h"
#include "../io/safetensors.h"
#include "hf_weights.h"

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

static int load_spec(const char *spec, fsdp_model_config *cfg, fsdp_err *err) {
    if (fsdp_model_preset(spec, cfg) == 0) return 0;
    struct stat st;
    if (stat(spec, &st) != 0) return fsdp_usagef(err, "--model '%s' is neither a preset nor a config.json", spec);
    return fsdp_hf_config_load(spec, cfg, err);
}

int fsdp_init_from_config(MPI_Comm comm, const char *path, const char *model_spec, fsdp_model_config *cfg,
                          fsdp_err *err) {
    struct stat st;
    char file[4200];
    int rc = 0;
    if (stat(path, &st) != 0) {
        rc = fsdp_errf(err, "--init-from %s: no such file or directory", path);
    } else if (S_ISDIR(st.st_mode)) {
        snprintf(file, sizeof file, "%s/config.json", path);
        if (stat(file, &st) != 0 || !S_ISREG(st.st_mode))
            rc = fsdp_errf(err, "--init-from %s: %s (a Hugging Face model directory holds config.json and the "
                           "weights)", path, stat(file, &st) ? "no config.json" : "config.json is not a regular file");
        else if (!fsdp_st_find_weights(path, file, sizeof file))
            rc = fsdp_errf(err, "--init-from %s: no model.safetensors or model.safetensors.index.json", path);
        else
            rc = fsdp_hf_config_load(path, cfg, err);
    } else if (!S_ISREG(st.st_mode)) {
        rc = fsdp_errf(err, "--init-from %s: not a directory or a regular file", path);
    } else if (ends_with(path, ".safetensors") || ends_with(path, ".json")) {
        rc = fsdp_usagef(err, "--init-from %s: give the model's directory (config.json beside the weights)", path);
    } else {
        /* An fsdp.c checkpoint: collective, so every rank takes this branch (same file system). */
        fsdp_ckpt_meta meta;
        memset(&meta, 0, sizeof meta);
        rc = fsdp_ckpt_read_meta(comm, path, &meta, err);
        if (rc == 0 && (!meta.config_json ||
                        fsdp_hf_config_parse(meta.config_json, strlen(meta.config_json), path, cfg, err)))
            rc = -1;
        fsdp_ckpt_meta_free(&meta);
    }
    if (rc == 0 && model_spec) {
        fsdp_model_config other;
        if (load_spec(model_spec, &other, err)) return -1;
        if (!fsdp_model_config_same_shape(&other, cfg)) {
            char a[256], b[256];
            fsdp_model_config_describe(&other, a, sizeof a);
            fsdp_model_config_describe(cfg, b, sizeof b);
            return fsdp_usagef(err, "--model %s (%s) is not the model of --init-from %s (%s); --init-from alone names "
                               "the model", model_spec, a, path, b);
        }
    }
    return rc;
}

/* ---- reading ---- */

typedef struct {
    fsdp_trainer *t;
    const char *path;
    double start, last_report;
    int64_t bytes; /* read by this rank */
} progress;

static void report(progress *p, int units_done) {
    double now = fsdp_now();
    int units = p->t->layout.num_units;
    if (now - p->last_report < 2.0 || units_done == units) return;
    p->last_report = now;
    double rate = p->bytes * (double)p->t->topo.world / (now - p->start); /* this rank's share times the ranks */
    double eta = (now - p->start) * (units - units_done) / units_done;
    fsdp_log("init-from: %d/%d units, %.2f GB read, %.0f MB/s, ETA %.0f s\n", units_done, units,
             p->bytes * (double)p->t->topo.world / 1e9, rate / 1e6, eta);
}

static void summary(progress *p, const char *what) {
    long long bytes = p->bytes;
    fsdp_mpi_allreduce(&bytes, 1, MPI_LONG_LONG, MPI_SUM, p->t->world, "the bytes read by every rank");
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    long long peak_kib = ru.ru_maxrss;
    fsdp_mpi_allreduce(&peak_kib, 1, MPI_LONG_LONG, MPI_MAX, p->t->world, "the peak host memory of every rank");
    double s = fsdp_now() - p->start;
    fsdp_log("init-from: %s (%s): %.2f GB read by %d ranks in %.2f s (%.0f MB/s); peak host memory per rank %.2f "
             "GiB\n",
             p->path, what, bytes / 1e9, p->t->topo.world, s, s > 0 ? bytes / s / 1e6 : 0.0,
             peak_kib / (1024.0 * 1024.0));
}

/* The largest shard length of any unit, for the one host staging buffer. */
static int64_t max_shard(const fsdp_trainer *t) {
    int64_t n = 1;
    for (int u = 0; u < t->layout.num_units; u++)
        if (fsdp_engine_view(t->eng, u).len > n) n = fsdp_engine_view(t->eng, u).len;
    return n;
}

/* Weights of an fsdp.c checkpoint, one collective read per unit. */
static int from_checkpoint(fsdp_trainer *t, progress *p, fsdp_err *err) {
    const fsdp_layout *l = &t->layout;
    float *host = fsdp_xmalloc((size_t)max_shard(t) * sizeof(float), "init-from staging");
    fsdp_ckpt_piece *pieces = fsdp_xcalloc((size_t)l->num_params, sizeof *pieces, "init-from pieces");
    fsdp_ckpt_tensor *table = fsdp_xcalloc((size_t)l->num_params, sizeof *table, "init-from tensors");
    int rc = 0;
    for (int u = 0; u < l->num_units && rc == 0; u++) {
        const fsdp_unit_desc *ud = &l->units[u];
        for (int k = 0; k < ud->num_params; k++) {
            const fsdp_param_desc *q = &l->params[ud->first_param + k];
            table[k] = (fsdp_ckpt_tensor){q->name, q->ndim, {q->shape[0], q->shape[1]}};
        }
        memset(host, 0, (size_t)fsdp_engine_view(t->eng, u).len * sizeof(float));
        int n = fsdp_trainer_unit_pieces(t, u, host, NULL, NULL, pieces);
        for (int i = 0; i < n; i++) {
            pieces[i].tensor -= ud->first_param;
            p->bytes += pieces[i].count * (int64_t)sizeof(float);
        }
        rc = fsdp_ckpt_read(t->world, p->path, table, ud->num_params, pieces, n, err);
        if (rc == 0) fsdp_trainer_unit_set_master(t, u, host);
        report(p, u + 1);
    }
    free(table);
    free(pieces);
    free(host);
    if (rc == 0) summary(p, "fsdp.c checkpoint, weights only");
    return rc;
}

/* ---- the Hugging Face pipeline ----
 *
 * This rank's shard of every unit is cut into windows of at most WINDOW_BYTES of fp32 (a window
 * never spans two units), and the weights' chunks, each at most CHUNK_BYTES of one tensor, into
 * those windows. READERS threads take the chunks in order: a thread preads a chunk's raw bytes (the
 * files' dtype) into its own buffer and converts them into the fp32 staging array of the chunk's
 * window. There are STAGED_WINDOWS staging arrays, so the readers go on with the next windows while
 * the main thread hands a complete one to the device: the disk keeps READERS large reads in flight
 * from the first chunk to the last, and conversion runs on the readers, between their reads.
 *
 * Windows rather than whole units, because the staging arrays are page-locked on a GPU host and
 * locking costs time in proportion to the size: staging of a unit's length (Llama-3.2-1B's
 * embedding on one rank is 1 GB in fp32: 0.36 s with the read plan, before any read, on an H200 host) kept the readers from
 * starting and then waiting while the second array was locked; the one-rank load of that model was
 * at 42% of dd's cold read.
 *
 * A tied embedding's chunk also reads the same elements of lm_head.weight and compares them with
 * the values just converted. */
enum {
    CHUNK_BYTES = 8 << 20,    /* one pread: large enough for the disk's full bandwidth per request */
    READERS = 6,              /* preads in flight while others convert: the queue depth a cold read needs */
    WINDOW_BYTES = 128 << 20, /* fp32 staging per window: 16 chunks of bf16, a few ms to copy to a GPU */
    STAGED_WINDOWS = 3        /* two windows read while the one before is handed to the device */
};

typedef struct {
    int unit;
    int64_t start, count; /* elements of the unit's shard */
} window;

typedef struct {
    int param;
    int window;
    int64_t start, count; /* elements of the parameter */
    int64_t dest;         /* element offset in the window's staging array */
} chunk;

/* Elements [start, start + count) of a window's staging array that no parameter covers (alignment
 * and the shard's padding): zeroed, the rest is overwritten by every window. */
typedef struct {
    int window;
    int64_t start, count;
} gap;

typedef struct {
    const fsdp_hf_weights *w;
    window *windows;
    int num_windows;
    chunk *chunks;
    int64_t num_chunks;
    gap *gaps;                /* in window order */
    int64_t num_gaps;
    float *staging[STAGED_WINDOWS];
    pthread_mutex_t lock;
    pthread_cond_t changed;   /* a chunk was converted, a staging array freed, or the readers must stop */
    int64_t next;             /* the next chunk a reader takes */
    int busy;                 /* readers reading or converting a chunk */
    int handed;               /* windows handed to the device: windows below handed + ready may be read */
    int ready;                /* staging arrays allocated so far (up to STAGED_WINDOWS) */
    int64_t *left;            /* per window: chunks not yet converted */
    int64_t bytes;            /* read so far */
    int64_t failed;           /* the first chunk that failed, num_chunks while none did */
    fsdp_err failure;
    int stop;
} pipeline;

/* raw: FSDP_ST_DIRECT_ALIGN-aligned, fsdp_st_aligned_cap(CHUNK_BYTES) bytes. */
static int read_chunk(pipeline *pl, const chunk *ch, void *raw, int64_t *bytes, fsdp_err *err) {
    const fsdp_st_tensor *sources[2];
    int m = fsdp_hf_weights_sources(pl->w, ch->param, sources);
    float *out = pl->staging[ch->window % STAGED_WINDOWS] + ch->dest;
    for (int k = 0; k < m; k++) {
        const void *data;
        if (fsdp_st_read_raw_aligned(&pl->w->set, sources[k], ch->start, ch->count, raw, &data, err)) return -1;
        *bytes += ch->count * fsdp_st_dtype_bits(sources[k]->dtype) / 8;
        if (k == 0) {
            fsdp_st_convert_f32(sources[k]->dtype, data, ch->count, out);
            if (fsdp_hf_weights_check_finite(pl->w, sources[k], ch->start, ch->count, out, err)) return -1;
        } else if (fsdp_hf_weights_check_tied(pl->w, ch->start, ch->count, data, out, err))
            return -1;
    }
    return 0;
}

static void *reader_main(void *arg) {
    pipeline *pl = arg;
    void *raw = NULL;
    int e = posix_memalign(&raw, FSDP_ST_DIRECT_ALIGN, fsdp_st_aligned_cap(CHUNK_BYTES));
    if (e != 0) fsdp_fatal("init-from: out of host memory for a read buffer: %s", strerror(e));
    pthread_mutex_lock(&pl->lock);
    for (;;) {
        while (!pl->stop && pl->next < pl->failed && pl->next < pl->num_chunks &&
               pl->chunks[pl->next].window >= pl->handed + pl->ready)
            pthread_cond_wait(&pl->changed, &pl->lock);
        if (pl->stop || pl->next >= pl->failed || pl->next >= pl->num_chunks) break;
        int64_t c = pl->next++;
        pl->busy++;
        pthread_mutex_unlock(&pl->lock);
        fsdp_err e;
        memset(&e, 0, sizeof e);
        int64_t bytes = 0;
        int rc = read_chunk(pl, &pl->chunks[c], raw, &bytes, &e);
        pthread_mutex_lock(&pl->lock);
        pl->busy--;
        pl->bytes += bytes;
        if (rc == 0) {
            pl->left[pl->chunks[c].window]--;
        } else if (c < pl->failed) {
            pl->failed = c;
            pl->failure = e;
        }
        pthread_cond_broadcast(&pl->changed);
    }
    pthread_mutex_unlock(&pl->lock);
    free(raw);
    return NULL;
}

/* Waits until window w is in its staging array (0), or a chunk up to its last has failed (-1, err
 * set: the first chunk's failure, once no reader can fail on an earlier one). *bytes becomes the
 * bytes read so far. */
static int wait_window(pipeline *pl, int w, int64_t *bytes, fsdp_err *err) {
    pthread_mutex_lock(&pl->lock);
    while (pl->left[w] > 0 && !(pl->failed < pl->num_chunks && pl->busy == 0))
        pthread_cond_wait(&pl->changed, &pl->lock);
    int rc = pl->left[w] > 0 ? -1 : 0;
    if (rc) *err = pl->failure;
    *bytes = pl->bytes;
    pthread_mutex_unlock(&pl->lock);
    return rc;
}

static void set_handed(pipeline *pl, int handed, int ready, int stop) {
    pthread_mutex_lock(&pl->lock);
    pl->handed = handed;
    pl->ready = ready;
    pl->stop = stop;
    pthread_cond_broadcast(&pl->changed);
    pthread_mutex_unlock(&pl->lock);
}

static int by_offset(const void *a, const void *b) {
    int64_t x = ((const fsdp_shard_span *)a)->offset, y = ((const fsdp_shard_span *)b)->offset;
    return (x > y) - (x < y);
}

/* Window w (starting at shard element w0) leaves [from, to) of the shard to no parameter. */
static void add_gap(pipeline *pl, int64_t *cap, int w, int64_t w0, int64_t from, int64_t to) {
    if (to <= from) return;
    FSDP_GROW(pl->gaps, pl->num_gaps, *cap, 256, "init-from gaps");
    pl->gaps[pl->num_gaps++] = (gap){w, from - w0, to - from};
}

/* Shard elements [a, b) of span s, in window w (starting at w0), as chunks of at most CHUNK_BYTES. */
static void add_chunks(pipeline *pl, int64_t *cap, const fsdp_shard_span *s, int w, int64_t w0, int64_t a, int64_t b) {
    int64_t per = CHUNK_BYTES / (fsdp_st_dtype_bits(pl->w->by_param[s->tensor]->dtype) / 8);
    for (int64_t at = a; at < b; at += per) {
        FSDP_GROW(pl->chunks, pl->num_chunks, *cap, 256, "init-from chunks");
        pl->chunks[pl->num_chunks++] =
            (chunk){s->tensor, w, s->start + (at - s->offset), b - at < per ? b - at : per, at - w0};
    }
}

/* This rank's windows of every unit in unit order, their chunks and the gaps between them. */
static void plan(fsdp_trainer *t, pipeline *pl, int64_t window_elems) {
    const fsdp_layout *l = &t->layout;
    fsdp_shard_span *spans = fsdp_xcalloc((size_t)l->num_params + 1, sizeof *spans, "init-from spans");
    int64_t num_windows = 0, window_cap = 0, chunk_cap = 0, gap_cap = 0;
    for (int u = 0; u < l->num_units; u++) {
        int n = fsdp_trainer_unit_spans(t, u, spans), first = 0;
        qsort(spans, (size_t)n, sizeof *spans, by_offset);
        int64_t len = fsdp_engine_view(t->eng, u).len;
        for (int64_t w0 = 0; w0 < len; w0 += window_elems) {
            int64_t w1 = len - w0 < window_elems ? len : w0 + window_elems, covered = w0;
            int w = (int)num_windows;
            FSDP_GROW(pl->windows, num_windows, window_cap, 256, "init-from windows");
            pl->windows[num_windows++] = (window){u, w0, w1 - w0};
            while (first < n && spans[first].offset + spans[first].count <= w0) first++;
            for (int i = first; i < n && spans[i].offset < w1; i++) {
                int64_t a = spans[i].offset > w0 ? spans[i].offset : w0;
                int64_t b = spans[i].offset + spans[i].count < w1 ? spans[i].offset + spans[i].count : w1;
                add_gap(pl, &gap_cap, w, w0, covered, a);
                add_chunks(pl, &chunk_cap, &spans[i], w, w0, a, b);
                covered = b;
            }
            add_gap(pl, &gap_cap, w, w0, covered, w1);
        }
    }
    free(spans);
    if (num_windows > (int64_t)1 << 30) fsdp_fatal("init-from: %lld staging windows", (long long)num_windows);
    pl->num_windows = (int)num_windows;
    pl->left = fsdp_xcalloc((size_t)num_windows + 1, sizeof *pl->left, "init-from windows");
    for (int64_t c = 0; c < pl->num_chunks; c++) pl->left[pl->chunks[c].window]++;
}

/* Zeroes window w's gaps in its staging array; *next walks the gaps in window order. */
static void zero_gaps(pipeline *pl, int w, int64_t *next) {
    float *host = pl->staging[w % STAGED_WINDOWS];
    for (; *next < pl->num_gaps && pl->gaps[*next].window == w; ++*next)
        memset(host + pl->gaps[*next].start, 0, (size_t)pl->gaps[*next].count * sizeof(float));
}

static int from_safetensors(fsdp_trainer *t, progress *p, fsdp_err *err) {
    const fsdp_layout *l = &t->layout;
    fsdp_hf_weights w;
    int rc = fsdp_hf_weights_open(p->path, &t->cfg, l, &w, err);
    if (fsdp_agree(t->world, err)) {
        if (rc == 0) fsdp_hf_weights_close(&w);
        return -1;
    }
    /* FSDP_CKPT_IO=direct (the default) reads the weights as checkpoints are read: around the page
     * cache, which a one-time read of a whole model gains nothing from. */
    if (fsdp_env_ckpt_direct_io()) fsdp_st_open_direct(&w.set);
    fsdp_backend *be = t->be;
    pipeline pl;
    memset(&pl, 0, sizeof pl);
    pl.w = &w;
    /* Where the load's time goes, for the line after the summary: before the readers start, waiting for
     * them, and handing windows to the device (what a load short of the disk's speed spends it on). */
    double began = fsdp_now(), waited = 0.0, handing = 0.0;
    int64_t window_elems = fsdp_env_test_init_from_window();
    if (window_elems == 0) window_elems = WINDOW_BYTES / (int64_t)sizeof(float);
    plan(t, &pl, window_elems);
    int64_t widest = 1;
    for (int i = 0; i < pl.num_windows; i++)
        if (pl.windows[i].count > widest) widest = pl.windows[i].count;
    /* Only the first staging array is made before the readers start, the others while the readers
     * fill it (pl.ready holds the readers back from the windows those take). */
    pl.staging[0] = be->runtime->alloc_host(be, (size_t)widest * sizeof(float), "init-from staging");
    pl.ready = 1;
    pl.failed = pl.num_chunks;
    int64_t next_gap = 0;
    zero_gaps(&pl, 0, &next_gap);
    int e;
    if ((e = pthread_mutex_init(&pl.lock, NULL)) != 0)
        fsdp_fatal("init-from %s: pthread_mutex_init failed: %s", p->path, strerror(e));
    if ((e = pthread_cond_init(&pl.changed, NULL)) != 0)
        fsdp_fatal("init-from %s: pthread_cond_init failed: %s", p->path, strerror(e));
    pthread_t readers[READERS];
    int started = 0;
    double before_readers = fsdp_now() - began;
    for (; started < READERS && started < pl.num_chunks; started++)
        if ((e = pthread_create(&readers[started], NULL, reader_main, &pl)) != 0) {
            rc = fsdp_errf(err, "init-from %s: starting reader thread %d of %d failed: %s", p->path, started + 1,
                           READERS, strerror(e));
            break;
        }
    for (int i = 1; i < STAGED_WINDOWS; i++) {
        pl.staging[i] = be->runtime->alloc_host(be, (size_t)widest * sizeof(float), "init-from staging");
        if (i < pl.num_windows) zero_gaps(&pl, i, &next_gap);
        set_handed(&pl, 0, i + 1, 0);
    }
    size_t master_bytes = fsdp_trainer_master_staging_bytes(t, widest);
    void *master = master_bytes ? be->runtime->alloc_host(be, master_bytes, "init-from master staging") : NULL;

    for (int i = 0; i < pl.num_windows && rc == 0; i++) {
        const window *win = &pl.windows[i];
        double t0 = fsdp_now();
        rc = wait_window(&pl, i, &p->bytes, err);
        double t1 = fsdp_now();
        waited += t1 - t0;
        if (rc) break;
        fsdp_trainer_unit_set_master_range(t, win->unit, win->start, win->count, pl.staging[i % STAGED_WINDOWS],
                                           master);
        handing += fsdp_now() - t1;
        if (i + STAGED_WINDOWS < pl.num_windows) zero_gaps(&pl, i + STAGED_WINDOWS, &next_gap);
        set_handed(&pl, i + 1, STAGED_WINDOWS, 0);
        if (i + 1 == pl.num_windows || pl.windows[i + 1].unit != win->unit) report(p, win->unit + 1);
    }

    set_handed(&pl, pl.handed, STAGED_WINDOWS, 1);
    for (int i = 0; i < started; i++)
        if ((e = pthread_join(readers[i], NULL)) != 0)
            fsdp_fatal("init-from %s: pthread_join of reader thread %d failed: %s", p->path, i + 1, strerror(e));
    pthread_cond_destroy(&pl.changed);
    pthread_mutex_destroy(&pl.lock);
    free(pl.windows);
    free(pl.chunks);
    free(pl.gaps);
    free(pl.left);
    if (master) be->runtime->free_host(be, master);
    for (int i = 0; i < STAGED_WINDOWS; i++) be->runtime->free_host(be, pl.staging[i]);
    char what[160];
    fsdp_hf_weights_describe(&w, what, sizeof what);
    fsdp_hf_weights_close(&w);
    if (fsdp_agree(t->world, err)) return -1;
    summary(p, what);
    double times[3] = {before_readers, waited, handing};
    fsdp_mpi_allreduce(times, 3, MPI_DOUBLE, MPI_MAX, t->world, "the load's time breakdown of every rank");
    fsdp_log("init-from: where the time went (each the largest over the ranks): %.2f s before the readers started "
             "(the read plan and the first staging window, page-locked on a GPU host), %.2f s waiting for the "
             "readers, %.2f s handing windows to the device (conversion to the master dtype and the copy)\n",
             times[0], times[1], times[2]);
    return 0;
}

int fsdp_trainer_init_from(fsdp_trainer *t, fsdp_err *err) {
    progress p = {t, t->opt.init_from, fsdp_now(), fsdp_now(), 0};
    struct stat st;
    int is_dir = stat(p.path, &st) == 0 && S_ISDIR(st.st_mode);
    int rc = is_dir ? from_safetensors(t, &p, err) : from_checkpoint(t, &p, err);
    if (rc == 0) fsdp_engine_refresh_working(t->eng);
    return rc;
}
