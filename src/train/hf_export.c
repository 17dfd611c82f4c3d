/* fsdp export (hf_export.h): sources, the round plan, the writer thread, publishing. */
#define _DEFAULT_SOURCE /* realpath */
#include "hf_export.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/agree.h"
#include "../base/fault.h"
#include "../base/log.h"
#include "../base/output_paths.h"
#include "../io/checkpoint.h"
#include "../io/export_dir.h"
#include "../io/hf_config.h"
#include "../io/hf_model_dir.h"
#include "../io/special_tokens.h"
#include "../io/tokenizer_export.h"
#include "../io/safetensors_write.h"
#include "hf_weights.h"

/* ---- where the weights come from ---- */

typedef enum { SRC_CHECKPOINT, SRC_HF, SRC_INIT } source_kind;

typedef struct {
    source_kind kind;
    char path[4200]; /* checkpoint file or Hugging Face directory; the model spec for SRC_INIT */
    fsdp_model_config cfg;
    fsdp_layout layout;
    fsdp_hf_weights hf;
    uint64_t seed;
    int model_is_path; /* SRC_INIT from a config.json (or its directory), not a preset */
    char *identity;    /* SRC_CHECKPOINT: its identity record (JSON), NULL when it has none */
} source;

static int resolve(const fsdp_export_options *o, source *s, fsdp_err *err) {
    struct stat st;
    if (o->model) {
        s->kind = SRC_INIT;
        snprintf(s->path, sizeof s->path, "%s", o->model);
        if (fsdp_model_preset(o->model, &s->cfg) == 0) return 0;
        if (stat(o->model, &st) != 0)
            return fsdp_usagef(err, "export: --model '%s' is neither a preset nor a config.json", o->model);
        s->model_is_path = 1;
        return fsdp_hf_config_load(o->model, &s->cfg, err);
    }
    if (stat(o->checkpoint, &st) != 0) return fsdp_errf(err, "--checkpoint %s: no such file or directory", o->checkpoint);
    if (!S_ISDIR(st.st_mode)) {
        s->kind = SRC_CHECKPOINT;
        snprintf(s->path, sizeof s->path, "%s", o->checkpoint);
        return 0;
    }
    char config[4300];
    snprintf(config, sizeof config, "%s/config.json", o->checkpoint);
    if (stat(config, &st) == 0) {
        s->kind = SRC_HF;
        snprintf(s->path, sizeof s->path, "%s", o->checkpoint);
        return fsdp_hf_config_load(o->checkpoint, &s->cfg, err);
    }
    s->kind = SRC_CHECKPOINT;
    int found = fsdp_ckpt_find_latest(o->checkpoint, s->path, (int)sizeof s->path, err);
    if (found == 0)
        return fsdp_errf(err, "--checkpoint %s: neither a --ckpt-dir (no 'latest' in it) nor a Hugging Face model "
                         "directory (no config.json)", o->checkpoint);
    return found < 0 ? -1 : 0;
}

/* Collective. */
static int open_source(MPI_Comm comm, const fsdp_export_options *o, source *s, fsdp_err *err) {
    memset(s, 0, sizeof *s);
    s->seed = o->seed;
    resolve(o, s, err);
    if (fsdp_agree(comm, err)) return -1;
    if (s->kind == SRC_CHECKPOINT) {
        fsdp_ckpt_meta meta;
        memset(&meta, 0, sizeof meta);
        if (fsdp_ckpt_read_meta(comm, s->path, &meta, err)) return -1;
        if (!meta.config_json || fsdp_hf_config_parse(meta.config_json, strlen(meta.config_json), s->path, &s->cfg, err))
            fsdp_errf(err, "%s: the checkpoint's model config cannot be read (%s)", s->path, err->msg);
        if (meta.identity_json) s->identity = strdup(meta.identity_json);
        fsdp_ckpt_meta_free(&meta);
        if (fsdp_agree(comm, err)) return -1;
    }
    fsdp_layout_build(&s->cfg, &s->layout);
    if (s->kind == SRC_HF) {
        int rc = fsdp_hf_weights_open(s->path, &s->cfg, &s->layout, &s->hf, err);
        if (fsdp_agree(comm, err)) {
            if (rc == 0) fsdp_hf_weights_close(&s->hf);
            fsdp_layout_free(&s->layout);
            return -1;
        }
    }
    return 0;
}

static void close_source(source *s) {
    free(s->identity);
    if (s->kind == SRC_HF) fsdp_hf_weights_close(&s->hf);
    fsdp_layout_free(&s->layout);
}

/* ---- the rounds: every tensor split into one range per rank, in chunks of at most B elements ---- */

typedef struct {
    int tensor;
    int64_t start, count; /* this rank's elements */
    float *values;
    uint64_t at;          /* byte offset of the encoded elements in the round's buffer */
} item;

static int64_t range_lo(int64_t n, int r, int world) { return n * r / world; }

/* The elements of chunk j of tensor i that belong to `rank`. */
static void chunk_of(const fsdp_param_desc *p, int j, int rank, int world, int64_t *start, int64_t *count) {
    int64_t lo = range_lo(p->numel, rank, world), hi = range_lo(p->numel, rank + 1, world);
    int64_t a = lo + (int64_t)j * FSDP_EXPORT_ROUND_ELEMENTS, b = a + FSDP_EXPORT_ROUND_ELEMENTS;
    *start = a;
    *count = (b < hi ? b : hi) - a;
    if (*count < 0) *count = 0;
}

static int num_chunks(const fsdp_param_desc *p, int world) {
    int64_t widest = (p->numel + world - 1) / world;
    int64_t n = (widest + FSDP_EXPORT_ROUND_ELEMENTS - 1) / FSDP_EXPORT_ROUND_ELEMENTS;
    return n > 0 ? (int)n : 1;
}

/* ---- the writer thread: pwrites one round while the next is read ---- */

typedef struct {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    fsdp_st_writer *w;
    item *job;       /* handed over, not yet taken */
    int job_n;
    const unsigned char *job_bytes;
    long taken, done;
    int stop;
    fsdp_err err;    /* the first failure */
} writer_thread;

static void *writer_main(void *arg) {
    writer_thread *wt = arg;
    pthread_mutex_lock(&wt->mu);
    for (;;) {
        while (!wt->job && !wt->stop) pthread_cond_wait(&wt->cv, &wt->mu);
        if (!wt->job) break;
        item *job = wt->job;
        int n = wt->job_n;
        const unsigned char *bytes = wt->job_bytes;
        wt->job = NULL;
        wt->taken++;
        int failed = wt->err.failed;
        pthread_cond_broadcast(&wt->cv);
        pthread_mutex_unlock(&wt->mu);
        fsdp_err e = {0};
        for (int i = 0; i < n && !failed; i++)
            failed = fsdp_st_pwrite(wt->w, job[i].tensor, job[i].start, job[i].count, bytes + job[i].at, &e) != 0;
        pthread_mutex_lock(&wt->mu);
        if (e.failed && !wt->err.failed) wt->err = e;
        wt->done++;
        pthread_cond_broadcast(&wt->cv);
    }
    pthread_mutex_unlock(&wt->mu);
    return NULL;
}

static void wait_done(writer_thread *wt, long rounds) {
    pthread_mutex_lock(&wt->mu);
    while (wt->done < rounds) pthread_cond_wait(&wt->cv, &wt->mu);
    pthread_mutex_unlock(&wt->mu);
}

static void submit(writer_thread *wt, item *job, int n, const unsigned char *bytes) {
    pthread_mutex_lock(&wt->mu);
    while (wt->job) pthread_cond_wait(&wt->cv, &wt->mu);
    wt->job = job, wt->job_n = n, wt->job_bytes = bytes;
    pthread_cond_broadcast(&wt->cv);
    pthread_mutex_unlock(&wt->mu);
}

static void writer_error(writer_thread *wt, fsdp_err *err) {
    pthread_mutex_lock(&wt->mu);
    if (wt->err.failed && !err->failed) *err = wt->err;
    pthread_mutex_unlock(&wt->mu);
}

/* ---- reading one round ---- */

static int read_round(MPI_Comm comm, source *s, item *items, int n, fsdp_err *err) {
    const fsdp_layout *l = &s->layout;
    if (s->kind == SRC_CHECKPOINT) {
        /* One collective read; a tensor appears at most once per round (a chunk that is not a
         * tensor's last fills a round by itself). */
        fsdp_ckpt_tensor *table = fsdp_xcalloc((size_t)n + 1, sizeof *table, "export tensors");
        fsdp_ckpt_piece *pieces = fsdp_xcalloc((size_t)n + 1, sizeof *pieces, "export pieces");
        int np = 0;
        for (int i = 0; i < n; i++) {
            const fsdp_param_desc *p = &l->params[items[i].tensor];
            table[i] = (fsdp_ckpt_tensor){p->name, p->ndim, {p->shape[0], p->shape[1]}};
            if (items[i].count > 0)
                pieces[np++] = (fsdp_ckpt_piece){i, items[i].start, items[i].count, items[i].values, NULL, NULL};
        }
        int rc = fsdp_ckpt_read(comm, s->path, table, n, pieces, np, err);
        free(pieces);
        free(table);
        return rc;
    }
    int64_t bytes = 0;
    for (int i = 0; i < n; i++) {
        if (items[i].count == 0) continue;
        if (s->kind == SRC_HF) {
            if (fsdp_hf_weights_read(&s->hf, items[i].tensor, items[i].start, items[i].count, items[i].values, &bytes,
                                     err))
                return -1;
            continue;
        }
        const fsdp_param_desc *p = &l->params[items[i].tensor];
        float *v = items[i].values;
        int64_t start = items[i].start, count = items[i].count;
        fsdp_param_init_fill(&s->cfg, p, s->seed, start, count, v);
    }
    return 0;
}

/* ---- the tokenizer ---- */

/* Rank 0: the tokenizer the export carries into buf, or "" with a line saying why there is none:
 * --tokenizer; a Hugging Face directory's own; for a checkpoint, the one its token file was prepared
 * with (the path its identity record keeps) while that file is still there with the same hash. */
static void find_tokenizer(const fsdp_export_options *o, const source *s, char *buf, size_t cap) {
    buf[0] = 0;
    struct stat st;
    char why[4600] = "";
    if (o->tokenizer) {
        snprintf(buf, cap, "%s", o->tokenizer);
        return;
    }
    if (s->kind == SRC_HF) {
        char path[4400];
        snprintf(path, sizeof path, "%s/tokenizer.json", s->path);
        if (stat(path, &st) == 0) {
            snprintf(buf, cap, "%s", s->path);
            return;
        }
        snprintf(why, sizeof why, "%s has no tokenizer.json", s->path);
    } else if (s->kind == SRC_INIT) {
        snprintf(why, sizeof why, "initial weights have no data");
    } else {
        json_t *r = s->identity ? json_loads(s->identity, 0, NULL) : NULL, *d = json_object_get(r, "data");
        const char *where = json_string_value(json_object_get(d, "tokenizer"));
        const char *hash = json_string_value(json_object_get(d, "tokenizer_hash"));
        uint64_t now = 0;
        fsdp_err ignored = {0};
        if (!where)
            snprintf(why, sizeof why, "the checkpoint %s records no tokenizer (trained on %s)", s->path,
                     d ? "a token file prepared without a tokenizer record, or synthetic data" : "data it does not name");
        else if (stat(where, &st) != 0)
            snprintf(why, sizeof why, "the tokenizer %s its data was prepared with is gone", where);
        else if (fsdp_tokenizer_identity_hash(where, &now, &ignored) || !hash || strtoull(hash, NULL, 16) != now)
            snprintf(why, sizeof why, "the tokenizer %s its data was prepared with has changed since (hash %s then, "
                     "%016llx now)", where, hash ? hash : "?", (unsigned long long)now);
        else
            snprintf(buf, cap, "%s", where);
        json_decref(r);
        if (buf[0]) return;
    }
    fsdp_log("export: %s will have no tokenizer (%s); add one with --tokenizer FILE|DIR\n", o->out, why);
}

/* ---- the export ---- */

/* Rank 0, before anything is written: the files the export replaces in --out are none of those it
 * reads (output_paths.h), and --out is not the model directory being exported. */
static int check_out(const fsdp_export_options *o, const source *s, const char *tokenizer, fsdp_err *err) {
    if (s->kind == SRC_HF) {
        char a[4096], b[4096];
        if (realpath(o->out, a) && realpath(s->path, b) && !strcmp(a, b))
            return fsdp_usagef(err, "--out %s is the directory being exported", o->out);
    }
    fsdp_io_path outputs[] = {FSDP_IO_DIR("--out", o->out, fsdp_export_replaces)};
    fsdp_io_path inputs[2];
    int n = 0;
    if (tokenizer[0]) inputs[n++] = FSDP_IO_FILE("--tokenizer", tokenizer);
    if (s->kind == SRC_HF)
        inputs[n++] = FSDP_IO_DIR("--checkpoint", s->path, fsdp_model_dir_reads);
    else if (s->kind == SRC_CHECKPOINT)
        inputs[n++] = FSDP_IO_FILE("--checkpoint", s->path);
    else if (s->model_is_path)
        inputs[n++] = FSDP_IO_DIR("--model", o->model, fsdp_model_dir_reads);
    return fsdp_outputs_apart(outputs, 1, inputs, n, err);
}

static const char *source_text(const source *s, char *buf, size_t cap) {
    if (s->kind == SRC_INIT)
        snprintf(buf, cap, "the initial weights of %s for seed %llu", s->path, (unsigned long long)s->seed);
    else
        snprintf(buf, cap, "%s %s", s->kind == SRC_HF ? "Hugging Face model" : "checkpoint", s->path);
    return buf;
}

typedef struct {
    double start;
    int64_t mine_total, mine_done; /* this rank's elements: the fraction done stands for every rank's */
} progress;

static void report(const progress *pr, double *last, uint64_t total_bytes) {
    double now = fsdp_now(), frac = pr->mine_total ? (double)pr->mine_done / (double)pr->mine_total : 1.0;
    if (now - *last < 2.0) return;
    *last = now;
    double secs = now - pr->start, rate = secs > 0 ? frac * (double)total_bytes / secs : 0.0;
    double eta = frac > 0 ? secs * (1 - frac) / frac : 0.0;
    fsdp_log("export: %3.0f%% of %.2f GB, %.0f MB/s, ETA %.0f s\n", 100 * frac, total_bytes / 1e9, rate / 1e6, eta);
}

/* Every round: read, agree, encode, hand to the writer. *pieces: how many this rank read. */
static int write_all(MPI_Comm comm, source *s, const fsdp_st_plan *plan, fsdp_st_writer *w, int *pieces,
                     fsdp_err *err) {
    int rank, world;
    FSDP_CHECK_MPI(MPI_Comm_rank(comm, &rank));
    FSDP_CHECK_MPI(MPI_Comm_size(comm, &world));
    const fsdp_layout *l = &s->layout;
    size_t es = plan->dtype == FSDP_ST_BF16 ? 2 : 4, round_cap = (size_t)FSDP_EXPORT_ROUND_ELEMENTS;
    float *values = fsdp_xmalloc(round_cap * sizeof(float), "export staging");
    unsigned char *bytes[2] = {fsdp_xmalloc(round_cap * es, "export staging"), fsdp_xmalloc(round_cap * es, "export staging")};
    item *items[2] = {fsdp_xcalloc((size_t)l->num_params + 1, sizeof(item), "export items"),
                      fsdp_xcalloc((size_t)l->num_params + 1, sizeof(item), "export items")};
    writer_thread wt;
    memset(&wt, 0, sizeof wt);
    wt.w = w;
    pthread_mutex_init(&wt.mu, NULL);
    pthread_cond_init(&wt.cv, NULL);
    if (pthread_create(&wt.thread, NULL, writer_main, &wt) != 0) fsdp_fatal("pthread_create failed for the export writer");
    progress pr = {fsdp_now(), 0, 0};
    for (int i = 0; i < l->num_params; i++) {
        int64_t a = range_lo(l->params[i].numel, rank, world), b = range_lo(l->params[i].numel, rank + 1, world);
        pr.mine_total += b - a;
    }
    double last = pr.start;
    int tensor = 0, chunk = 0, pieces_done = 0, rc = 0;
    for (long round = 0; tensor < l->num_params && rc == 0; round++) {
        int slot = (int)(round % 2), n = 0;
        int64_t used = 0, filled = 0;
        wait_done(&wt, round - 1); /* the writer is done with this slot's previous round */
        while (tensor < l->num_params) {
            const fsdp_param_desc *p = &l->params[tensor];
            /* room: the largest any rank's piece of this chunk can be, the same on every rank */
            int64_t start, count, room = (p->numel + world - 1) / world - (int64_t)chunk * FSDP_EXPORT_ROUND_ELEMENTS;
            if (room > FSDP_EXPORT_ROUND_ELEMENTS) room = FSDP_EXPORT_ROUND_ELEMENTS;
            if (n > 0 && used + room > FSDP_EXPORT_ROUND_ELEMENTS) break;
            chunk_of(p, chunk, rank, world, &start, &count);
            items[slot][n++] = (item){tensor, start, count, values + filled, (uint64_t)filled * es};
            used += room;
            filled += count;
            if (++chunk == num_chunks(p, world)) tensor++, chunk = 0;
        }
        for (int i = 0; i < n; i++)
            if (items[slot][i].count > 0) fsdp_fault_point(++pieces_done); /* FSDP_TEST_FAIL counts pieces here */
        read_round(comm, s, items[slot], n, err);
        writer_error(&wt, err);
        if ((rc = fsdp_agree(comm, err)) != 0) break;
        for (int i = 0; i < n; i++)
            fsdp_st_encode(plan, items[slot][i].values, items[slot][i].count, bytes[slot] + items[slot][i].at);
        submit(&wt, items[slot], n, bytes[slot]);
        pr.mine_done += filled;
        if (rank == 0) report(&pr, &last, plan->total_bytes);
    }
    pthread_mutex_lock(&wt.mu);
    wt.stop = 1;
    pthread_cond_broadcast(&wt.cv);
    pthread_mutex_unlock(&wt.mu);
    pthread_join(wt.thread, NULL);
    writer_error(&wt, err);
    pthread_mutex_destroy(&wt.mu);
    pthread_cond_destroy(&wt.cv);
    free(items[0]);
    free(items[1]);
    free(bytes[0]);
    free(bytes[1]);
    free(values);
    *pieces = pieces_done;
    return err->failed ? -1 : 0;
}

int fsdp_export(MPI_Comm comm, const fsdp_export_options *o, fsdp_err *err) {
    int rank;
    FSDP_CHECK_MPI(MPI_Comm_rank(comm, &rank));
    double t0 = fsdp_now();
    source s;
    if (open_source(comm, o, &s, err)) return -1;
    /* Rank 0 owns --out: its lock, and the staging directory every rank writes into. */
    fsdp_export_dir *dir = NULL;
    char staging[4600] = "";
    char tokenizer[4400] = "";
    if (rank == 0) find_tokenizer(o, &s, tokenizer, sizeof tokenizer);
    if (rank == 0 && check_out(o, &s, tokenizer, err) == 0 &&
        (dir = fsdp_export_dir_begin(o->out, o->force, err)) != NULL) {
        snprintf(staging, sizeof staging, "%s", fsdp_export_dir_staging(dir));
        if (tokenizer[0]) fsdp_export_dir_replace_tokenizer(dir);
    }
    if (fsdp_agree(comm, err)) {
        fsdp_export_dir_end(dir);
        close_source(&s);
        return -1;
    }
    FSDP_CHECK_MPI(MPI_Bcast(staging, (int)sizeof staging, MPI_CHAR, 0, comm));
    fsdp_st_spec *specs = fsdp_xcalloc((size_t)s.layout.num_params + 1, sizeof *specs, "export tensors");
    for (int i = 0; i < s.layout.num_params; i++) {
        const fsdp_param_desc *p = &s.layout.params[i];
        specs[i].name = p->name;
        specs[i].ndim = p->ndim;
        specs[i].shape[0] = p->shape[0];
        specs[i].shape[1] = p->shape[1];
    }
    fsdp_st_plan plan;
    fsdp_st_plan_build(specs, s.layout.num_params, o->bf16 ? FSDP_ST_BF16 : FSDP_ST_F32, o->max_shard_bytes, &plan, err);
    free(specs);
    if (rank == 0 && !err->failed) {
        if (fsdp_st_create(staging, &plan, err) == 0 &&
            fsdp_hf_stage_configs(staging, &s.cfg, o->bf16 ? "bfloat16" : "float32", err) == 0 && tokenizer[0])
            fsdp_tokenizer_stage(staging, tokenizer, &s.cfg, err);
    }
    fsdp_st_writer w;
    memset(&w, 0, sizeof w);
    int pieces = 0;
    if (fsdp_agree(comm, err) == 0) {
        fsdp_st_writer_open(&w, staging, &plan, err);
        if (fsdp_agree(comm, err) == 0) write_all(comm, &s, &plan, &w, &pieces, err);
    }
    if (w.fds) fsdp_st_writer_close(&w, !err->failed, err);
    if (fsdp_agree(comm, err) == 0 && rank == 0) {
        if (fsdp_st_publish(staging, &plan, err) == 0 && fsdp_hf_publish_configs(staging, err) == 0 &&
            (!tokenizer[0] || fsdp_tokenizer_publish(staging, err) == 0)) {
            /* FSDP_TEST_FAIL counts two more points after the pieces: the new model complete beside
             * --out, then --out switched to it with the old model not yet removed. */
            fsdp_fault_point(pieces + 1);
            if (fsdp_export_dir_switch(dir, err) == 0) fsdp_fault_point(pieces + 2);
        }
    }
    int rc = fsdp_agree(comm, err);
    if (rank == 0) {
        fsdp_export_dir_end(dir); /* the old model or the unused staging directory goes; the lock too */
        if (rc == 0) {
            char from[4400];
            double secs = fsdp_now() - t0;
            fsdp_log("export: wrote %s: %d weight file%s, %.2f GB (%s) from %s in %.2f s (%.0f MB/s)\n", o->out,
                     plan.num_files, plan.num_files == 1 ? "" : "s", plan.total_bytes / 1e9, o->bf16 ? "bf16" : "fp32",
                     source_text(&s, from, sizeof from), secs, secs > 0 ? plan.total_bytes / secs / 1e6 : 0.0);
        }
    }
    fsdp_st_plan_free(&plan);
    close_source(&s);
    return rc;
}
