/* Checkpoint integrity under mpirun -np 3: the staged writer (begin, background transfer, commit)
 * with bf16 buffers; checksums that catch a flipped byte on every read path (any split of the
 * pieces, overlapping ones included) and fsdp_ckpt_verify; edited attributes refused; pieces that
 * do not tile a tensor, non-finite values and abandoned saves leave nothing behind. */
#define _DEFAULT_SOURCE
#include <dirent.h>
#include <hdf5.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/checkpoint.h"
#include "mpi_check.h"

static char dir[1024];

enum { NT = 3 };
static const fsdp_ckpt_tensor TENSORS[NT] = {
    {"model.embed_tokens.weight", 2, {33, 64}},
    {"model.norm.weight", 1, {64, 1}},
    {"model.layers.0.mlp.up_proj.weight", 2, {130, 64}}, /* large enough for O_DIRECT blocks */
};

static int64_t numel(int t) { return TENSORS[t].shape[0] * (TENSORS[t].ndim == 2 ? TENSORS[t].shape[1] : 1); }
/* Second moments (kind 2) are never negative: the writer and the readers refuse a negative one. */
static float value(int t, int k, int64_t i) { return (float)((t * 7 + k * 3 + i) % 509) * 0.125f - (k == 2 ? 0.0f : 30.0f); }

static void meta_of(fsdp_ckpt_meta *m) {
    memset(m, 0, sizeof *m);
    m->step = 12, m->samples_seen = 48, m->seed = 7, m->world_size = size;
    snprintf(m->strategy, sizeof m->strategy, "SHARD_GRAD_OP");
    m->config_json = "{\"model_type\": \"llama\"}";
    m->run_json = "{}";
    m->schedule_json = "{\"type\": \"warmup_cosine\", \"lr\": 0.001, \"min_lr\": 0, \"warmup\": 2, \"total_steps\": "
                       "20, \"last_lr\": 0.0005}";
}

typedef struct {
    fsdp_ckpt_piece p[NT];
    int n;
} pieces;

/* Rank r's piece of tensor t: [s, s + c); `overlap`: every rank takes the whole tensor. */
static void make(pieces *ps, int bf16, int fill, int overlap, int with_optimizer) {
    ps->n = 0;
    size_t es = bf16 ? 2 : 4;
    for (int t = 0; t < NT; t++) {
        int64_t n = numel(t), s = overlap ? 0 : n * rank / size, e = overlap ? n : n * (rank + 1) / size;
        fsdp_ckpt_piece *p = &ps->p[ps->n++];
        p->tensor = t, p->start = s, p->count = e - s;
        void **bufs[3] = {&p->param, &p->exp_avg, &p->exp_avg_sq};
        for (int k = 0; k < 3; k++) {
            *bufs[k] = k == 0 || with_optimizer ? calloc((size_t)(e - s) + 1, es) : NULL;
            for (int64_t i = 0; *bufs[k] && fill && i < e - s; i++) {
                float v = value(t, k, s + i);
                if (bf16)
                    ((uint16_t *)*bufs[k])[i] = fsdp_f32_to_bf16(v);
                else
                    ((float *)*bufs[k])[i] = v;
            }
        }
    }
}

static void release(pieces *ps) {
    for (int i = 0; i < ps->n; i++) free(ps->p[i].param), free(ps->p[i].exp_avg), free(ps->p[i].exp_avg_sq);
}

/* Every element read is the written value (rounded to bf16 when written from bf16). */
static int matches(const pieces *ps, int written_bf16) {
    int bad = 0;
    for (int i = 0; i < ps->n; i++)
        for (int k = 0; k < 3; k++) {
            const float *b = k == 0 ? ps->p[i].param : k == 1 ? ps->p[i].exp_avg : ps->p[i].exp_avg_sq;
            for (int64_t j = 0; b && j < ps->p[i].count; j++) {
                float want = value(ps->p[i].tensor, k, ps->p[i].start + j);
                if (written_bf16) want = fsdp_round_bf16(want);
                bad += b[j] != want;
            }
        }
    return bad == 0;
}

static int count_tmp(void) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += strstr(e->d_name, ".tmp") != NULL;
    if (d) closedir(d);
    return n;
}

/* The same failure on every rank, with both pieces of text. */
static void same_failure(int rc, const fsdp_err *err, const char *a, const char *b, int line) {
    char first[1024];
    memcpy(first, err->msg, sizeof first);
    MPI_Bcast(first, sizeof first, MPI_CHAR, 0, MPI_COMM_WORLD);
    check_quiet(rc == -1 && strstr(err->msg, a) && (!b || strstr(err->msg, b)) && !strcmp(first, err->msg),
                "line %d: want '%s'%s%s, got %d: %s", line, a, b ? " and " : "", b ? b : "", rc, err->msg);
}

/* Rank 0 edits the file serially: flips one byte of a dataset, or rewrites an integer attribute. */
static void flip_byte(const char *path, const char *dataset, int64_t element) {
    if (rank == 0) {
        hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT), d = H5Dopen2(f, dataset, H5P_DEFAULT);
        haddr_t at = H5Dget_offset(d);
        H5Dclose(d);
        H5Fclose(f);
        FILE *raw = fopen(path, "r+b");
        fseek(raw, (long)(at + (haddr_t)element * 4 + 1), SEEK_SET);
        int c = fgetc(raw);
        fseek(raw, (long)(at + (haddr_t)element * 4 + 1), SEEK_SET);
        fputc(c ^ 0x10, raw);
        fclose(raw);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

static void set_int_attr(const char *path, const char *name, long long v) {
    if (rank == 0) {
        hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT), a = H5Aopen(f, name, H5P_DEFAULT);
        H5Awrite(a, H5T_NATIVE_LLONG, &v);
        H5Aclose(a);
        H5Fclose(f);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

static void copy_file(const char *from, const char *to) {
    if (rank == 0) {
        FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
        char buf[65536];
        for (size_t n; (n = fread(buf, 1, sizeof buf, in)) > 0;) fwrite(buf, 1, n, out);
        fclose(in);
        fclose(out);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    fsdp_set_rank(rank, size);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    if (rank == 0) {
        snprintf(dir, sizeof dir, "%s/test_ckpt_stages_%d", getenv("FSDP_TEST_TMP") ? getenv("FSDP_TEST_TMP") : "/tmp",
                 (int)getpid());
        mkdir(dir, 0755);
    }
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    char good[1200], bad[1200];
    snprintf(good, sizeof good, "%s/step-00000012.h5", dir);
    snprintf(bad, sizeof bad, "%s/damaged.h5", dir);
    fsdp_ckpt_meta meta;
    meta_of(&meta);
    fsdp_err err = {0};

    /* Staged, from bf16 buffers; read back as fp32 (split differently) and as bf16. */
    pieces w, r;
    make(&w, 1, 1, 0, 1);
    fsdp_ckpt_writer *wr = fsdp_ckpt_begin(MPI_COMM_WORLD, good, TENSORS, NT, w.p, w.n, FSDP_BF16, &meta, &err);
    CHECK(wr != NULL);
    if (wr) {
        fsdp_ckpt_start(wr);
        while (!fsdp_ckpt_done(wr)) usleep(1000);
        CHECK(fsdp_ckpt_bytes_done(wr) == fsdp_ckpt_bytes_total(wr) && fsdp_ckpt_write_s(wr) > 0);
        CHECK(fsdp_ckpt_commit(wr, &err) == 0);
    }
    release(&w);
    CHECK(access(good, F_OK) == 0 && count_tmp() == 0);
    make(&r, 0, 0, 1, 1); /* every rank reads everything: the checksums must still add up */
    CHECK(fsdp_ckpt_read(MPI_COMM_WORLD, good, TENSORS, NT, r.p, r.n, &err) == 0 && matches(&r, 1));
    if (err.failed) fprintf(stderr, "rank %d: %s\n", rank, err.msg);
    release(&r);
    make(&r, 1, 0, 0, rank != 1); /* bf16 buffers, weights only on rank 1 */
    CHECK(fsdp_ckpt_read_as(MPI_COMM_WORLD, good, TENSORS, NT, r.p, r.n, FSDP_BF16, &err) == 0);
    int ok = 1;
    for (int i = 0; i < r.n; i++)
        for (int64_t j = 0; j < r.p[i].count; j++)
            ok &= ((uint16_t *)r.p[i].param)[j] == fsdp_f32_to_bf16(value(r.p[i].tensor, 0, r.p[i].start + j));
    CHECK(ok);
    release(&r);
    fsdp_ckpt_info info;
    CHECK(fsdp_ckpt_verify(MPI_COMM_WORLD, good, &info, &err) == 0);
    CHECK(info.num_datasets == 3 * NT && info.num_weights == NT && info.has_optimizer && info.checksummed &&
          info.format_version == FSDP_CKPT_FORMAT_VERSION && info.meta.step == 12 && info.meta.world_size == size);
    fsdp_ckpt_meta_free(&info.meta);

    /* One flipped bit in exp_avg of the last tensor. */
    copy_file(good, bad);
    flip_byte(bad, "optimizer/exp_avg/model.layers.0.mlp.up_proj.weight", 4321);
    make(&r, 0, 0, 0, 1);
    memset(&err, 0, sizeof err);
    int rc = fsdp_ckpt_read(MPI_COMM_WORLD, bad, TENSORS, NT, r.p, r.n, &err);
    same_failure(rc, &err, "optimizer/exp_avg/model.layers.0.mlp.up_proj.weight does not match its checksum", bad,
                 __LINE__);
    release(&r);
    memset(&err, 0, sizeof err);
    rc = fsdp_ckpt_verify(MPI_COMM_WORLD, bad, &info, &err);
    same_failure(rc, &err, "optimizer/exp_avg/model.layers.0.mlp.up_proj.weight does not match its checksum", NULL,
                 __LINE__);
    make(&r, 0, 0, 0, 0); /* weights only: the damaged moment is not read, nothing to refuse */
    memset(&err, 0, sizeof err);
    CHECK(fsdp_ckpt_read(MPI_COMM_WORLD, bad, TENSORS, NT, r.p, r.n, &err) == 0 && matches(&r, 1));
    release(&r);

    /* Edited attributes. */
    copy_file(good, bad);
    set_int_attr(bad, "step", 13);
    fsdp_ckpt_meta back;
    memset(&err, 0, sizeof err);
    rc = fsdp_ckpt_read_meta(MPI_COMM_WORLD, bad, &back, &err);
    same_failure(rc, &err, "do not match 'attributes_checksum'", bad, __LINE__);
    set_int_attr(bad, "step", -5);
    memset(&err, 0, sizeof err);
    rc = fsdp_ckpt_read_meta(MPI_COMM_WORLD, bad, &back, &err);
    same_failure(rc, &err, "attribute 'step' is -5", NULL, __LINE__);
    set_int_attr(bad, "step", 1LL << 62);
    memset(&err, 0, sizeof err);
    rc = fsdp_ckpt_verify(MPI_COMM_WORLD, bad, &info, &err);
    same_failure(rc, &err, "attribute 'step' is 4611686018427387904", NULL, __LINE__);
    set_int_attr(bad, "step", 12);
    set_int_attr(bad, "samples_seen", -100);
    memset(&err, 0, sizeof err);
    rc = fsdp_ckpt_read_meta(MPI_COMM_WORLD, bad, &back, &err);
    same_failure(rc, &err, "attribute 'samples_seen' is -100", NULL, __LINE__);
    if (rank == 0) unlink(bad);

    /* Pieces that leave a gap are refused before anything is written. */
    make(&w, 0, 1, 0, 1);
    if (rank == size - 1) w.p[1].count--;
    memset(&err, 0, sizeof err);
    rc = fsdp_ckpt_write(MPI_COMM_WORLD, bad, TENSORS, NT, w.p, w.n, &meta, &err);
    same_failure(rc, &err, "model.norm.weight do not cover it exactly once", NULL, __LINE__);
    release(&w);
    /* A NaN on one rank: refused at commit on every rank, nothing left. */
    make(&w, 0, 1, 0, 1);
    if (rank == 1) ((float *)w.p[2].exp_avg_sq)[3] = NAN;
    memset(&err, 0, sizeof err);
    rc = fsdp_ckpt_write(MPI_COMM_WORLD, bad, TENSORS, NT, w.p, w.n, &meta, &err);
    same_failure(rc, &err, "optimizer/exp_avg_sq/model.layers.0.mlp.up_proj.weight holds non-finite values", "rank 1",
                 __LINE__);
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(access(bad, F_OK) != 0 && count_tmp() == 0);
    /* A negative second moment: refused the same way, naming the element. */
    if (rank == 1) ((float *)w.p[2].exp_avg_sq)[3] = -1.0f;
    memset(&err, 0, sizeof err);
    rc = fsdp_ckpt_write(MPI_COMM_WORLD, bad, TENSORS, NT, w.p, w.n, &meta, &err);
    same_failure(rc, &err, "optimizer/exp_avg_sq/model.layers.0.mlp.up_proj.weight holds negative values", "(-1)",
                 __LINE__);
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(access(bad, F_OK) != 0 && count_tmp() == 0);
    /* An abandoned save (a run that stops) leaves no temporary file. */
    ((float *)w.p[2].exp_avg_sq)[3] = 1.0f;
    memset(&err, 0, sizeof err);
    wr = fsdp_ckpt_begin(MPI_COMM_WORLD, bad, TENSORS, NT, w.p, w.n, FSDP_F32, &meta, &err);
    CHECK(wr != NULL);
    fsdp_ckpt_start(wr);
    fsdp_ckpt_abandon(wr);
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(access(bad, F_OK) != 0 && count_tmp() == 0);
    release(&w);

    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) unlink(good), rmdir(dir);
    int status = mpi_check_summary("test_ckpt_stages");
    MPI_Finalize();
    return status;
}
