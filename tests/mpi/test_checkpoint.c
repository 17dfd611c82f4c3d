/* Parallel HDF5 checkpoints under mpirun -np 3: pieces split at arbitrary flat offsets (across row
 * boundaries, one tensor written by a subset of ranks) read back exactly under a different split,
 * in one or many transfer rounds; the metadata round trip; every failure (wrong shape, missing
 * tensor, truncated, missing, foreign or newer file, bad pieces on one rank, an unwritable path)
 * gives -1 with the same message on every rank and leaves no temporary file; the latest/prune
 * helpers. */
#include <dirent.h>
#include <fcntl.h>
#include <hdf5.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/checkpoint.h"
#include "io/ckpt_dir.h"
#include "mpi_check.h"

static char dir[1024];

enum { NT = 6 };
static const fsdp_ckpt_tensor TENSORS[NT] = {
    {"model.embed_tokens.weight", 2, {7, 5}},
    {"model.norm.weight", 1, {13, 1}},
    {"model.layers.0.mlp.down_proj.weight", 2, {4, 9}}, /* written by the first and last rank only */
    {"lm_head.weight", 2, {1, 11}},
    {"model.layers.0.self_attn.q_proj.bias", 1, {1, 1}}, /* written by the last rank only */
    {"model.layers.1.mlp.up_proj.weight", 2, {50, 37}},
};

static int64_t numel(int t) { return TENSORS[t].shape[0] * (TENSORS[t].ndim == 2 ? TENSORS[t].shape[1] : 1); }

/* Exactly representable, different for every tensor, kind and element. */
static float value(int t, int kind, int64_t i) { return (float)(t * 10000 + kind * 1000000 + i) + 0.25f; }

static void path_of(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", dir, name); }

/* The write split: contiguous ranges with cut points nudged off the natural boundaries so that
 * they fall inside rows. */
static void write_range(int t, int r, int64_t *start, int64_t *count) {
    int64_t n = numel(t);
    if (t == 2 || t == 4) { /* a subset of the ranks */
        int64_t cut = size > 1 ? (t == 2 ? 17 : 0) : n;
        *start = r == 0 ? 0 : r == size - 1 ? cut : 0;
        *count = r == 0 ? cut : r == size - 1 ? n - cut : 0;
        if (size == 1) *start = 0, *count = n;
        return;
    }
    int64_t a = n * r / size + (r > 0 ? 3 : 0), b = n * (r + 1) / size + (r + 1 < size ? 3 : 0);
    if (a > n) a = n;
    if (b > n) b = n;
    *start = a;
    *count = b - a;
}

/* The read split: rank r reads a range unrelated to what it wrote, overlapping its neighbours'. */
static void read_range(int t, int r, int64_t *start, int64_t *count) {
    int64_t n = numel(t);
    int64_t a = (n * (size - 1 - r)) / (size + 1), len = n / 2 + 1;
    if (a + len > n) len = n - a;
    *start = a;
    *count = len;
}

typedef struct {
    fsdp_ckpt_piece pieces[NT];
    int num;
} piece_set;

/* This rank's pieces under the write or the read split; filled with the expected values when
 * `fill`, zero otherwise. */
static void make_pieces(piece_set *ps, int read_split, int fill, int with_optimizer) {
    ps->num = 0;
    for (int t = 0; t < NT; t++) {
        int64_t s = 0, n = 0;
        (read_split ? read_range : write_range)(t, rank, &s, &n);
        if (n == 0 && (t + rank) % 2) continue; /* sometimes a zero-length piece, sometimes none */
        fsdp_ckpt_piece *p = &ps->pieces[ps->num++];
        p->tensor = t, p->start = s, p->count = n;
        p->param = calloc((size_t)n + 1, sizeof(float));
        p->exp_avg = with_optimizer ? calloc((size_t)n + 1, sizeof(float)) : NULL;
        p->exp_avg_sq = with_optimizer ? calloc((size_t)n + 1, sizeof(float)) : NULL;
        for (int64_t i = 0; i < n && fill; i++) {
            ((float *)p->param)[i] = value(t, 0, s + i);
            if (with_optimizer)
                ((float *)p->exp_avg)[i] = value(t, 1, s + i), ((float *)p->exp_avg_sq)[i] = value(t, 2, s + i);
        }
    }
}

static void free_pieces(piece_set *ps) {
    for (int i = 0; i < ps->num; i++) {
        free(ps->pieces[i].param);
        free(ps->pieces[i].exp_avg);
        free(ps->pieces[i].exp_avg_sq);
    }
    ps->num = 0;
}

/* Every element read equals what was written. */
static int pieces_match(const piece_set *ps) {
    int bad = 0;
    for (int i = 0; i < ps->num; i++) {
        const fsdp_ckpt_piece *p = &ps->pieces[i];
        for (int64_t j = 0; j < p->count; j++) {
            float *bufs[3] = {(float *)p->param, (float *)p->exp_avg, (float *)p->exp_avg_sq};
            for (int k = 0; k < 3; k++)
                if (bufs[k] && bufs[k][j] != value(p->tensor, k, p->start + j)) {
                    if (bad++ < 5)
                        fprintf(stderr, "rank %d: %s kind %d element %lld: %g, want %g\n", rank,
                                TENSORS[p->tensor].name, k, (long long)(p->start + j), bufs[k][j],
                                value(p->tensor, k, p->start + j));
                }
        }
    }
    return bad == 0;
}

static void sample_meta(fsdp_ckpt_meta *m, const char *config) {
    memset(m, 0, sizeof *m);
    m->step = 1234;
    m->samples_seen = 1LL << 40;
    m->seed = 0xFEDCBA9876543210ULL;
    m->world_size = size;
    snprintf(m->strategy, sizeof m->strategy, "FULL");
    m->config_json = (char *)config;
    m->schedule_json = "{\"type\": \"warmup_cosine\", \"lr\": 0.0003, \"min_lr\": 0, \"warmup\": 100, "
                       "\"total_steps\": 2000, \"last_lr\": 0.0002}";
    m->run_json = "{\"note\": \"caf\xC3\xA9 \\\"quoted\\\"\"}";
}

/* The call failed on this rank with a message holding both pieces, and every rank got the same one. */
static void expect_failure(int rc, const fsdp_err *err, const char *piece1, const char *piece2, int line) {
    char first[1024];
    memcpy(first, err->msg, sizeof first);
    MPI_Bcast(first, sizeof first, MPI_CHAR, 0, MPI_COMM_WORLD);
    check_quiet(rc == -1 && err->failed && strstr(err->msg, piece1) && (!piece2 || strstr(err->msg, piece2)) &&
                    !strcmp(first, err->msg) && !strchr(err->msg, '\n'),
                "line %d: want -1 with '%s'%s%s; got %d: %s", line, piece1, piece2 ? " and " : "", piece2 ? piece2 : "",
                rc, err->msg);
    if (rank == 0 && getenv("FSDP_TEST_VERBOSE")) printf("expected failure: %s\n", err->msg);
}

static int count_files_with(const char *suffix) {
    DIR *d = opendir(dir);
    int n = 0;
    size_t ls = strlen(suffix);
    for (struct dirent *e; d && (e = readdir(d));) {
        size_t l = strlen(e->d_name);
        n += l >= ls && !strcmp(e->d_name + l - ls, suffix);
    }
    if (d) closedir(d);
    return n;
}

static int exists(const char *path) { return access(path, F_OK) == 0; }

/* `io_threads`: FSDP_CKPT_THREADS for this round trip, NULL for the default. */
static void test_round_trip(const char *path, const char *io_threads) {
    if (io_threads)
        setenv("FSDP_CKPT_THREADS", io_threads, 1);
    else
        unsetenv("FSDP_CKPT_THREADS");
    piece_set w, r;
    fsdp_ckpt_meta meta, back;
    sample_meta(&meta, "{\"model_type\": \"llama\"}");
    fsdp_err err = {0};
    make_pieces(&w, 0, 1, 1);
    CHECK(fsdp_ckpt_write(MPI_COMM_WORLD, path, TENSORS, NT, w.pieces, w.num, &meta, &err) == 0);
    if (err.failed) fprintf(stderr, "rank %d: %s\n", rank, err.msg);
    free_pieces(&w);
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(exists(path) && count_files_with(".tmp") == 0);

    CHECK(fsdp_ckpt_read_meta(MPI_COMM_WORLD, path, &back, &err) == 0);
    CHECK(back.step == meta.step && back.samples_seen == meta.samples_seen && back.seed == meta.seed);
    CHECK(back.world_size == size && !strcmp(back.strategy, "FULL"));
    CHECK(back.config_json && !strcmp(back.config_json, meta.config_json));
    CHECK(back.schedule_json && !strcmp(back.schedule_json, meta.schedule_json));
    CHECK(back.run_json && !strcmp(back.run_json, meta.run_json));
    fsdp_ckpt_meta_free(&back);
    CHECK(back.config_json == NULL);

    make_pieces(&r, 1, 0, 1);
    CHECK(fsdp_ckpt_read(MPI_COMM_WORLD, path, TENSORS, NT, r.pieces, r.num, &err) == 0);
    if (err.failed) fprintf(stderr, "rank %d: %s\n", rank, err.msg);
    CHECK(pieces_match(&r));
    free_pieces(&r);

    /* Weights only on some ranks, everything on others; and the write split read back too. */
    make_pieces(&r, 1, 0, rank % 2);
    CHECK(fsdp_ckpt_read(MPI_COMM_WORLD, path, TENSORS, NT, r.pieces, r.num, &err) == 0);
    CHECK(pieces_match(&r));
    free_pieces(&r);
    make_pieces(&r, 0, 0, 0);
    CHECK(fsdp_ckpt_read(MPI_COMM_WORLD, path, TENSORS, NT, r.pieces, r.num, &err) == 0);
    CHECK(pieces_match(&r));
    free_pieces(&r);
    unsetenv("FSDP_CKPT_THREADS");
}

static void test_shape_errors(const char *path) {
    fsdp_ckpt_tensor t[NT];
    memcpy(t, TENSORS, sizeof t);
    piece_set r;
    fsdp_err err = {0};
    make_pieces(&r, 1, 0, 1);
    t[0].shape[0] = 5, t[0].shape[1] = 7;
    int rc = fsdp_ckpt_read(MPI_COMM_WORLD, path, t, NT, r.pieces, r.num, &err);
    expect_failure(rc, &err, "model.embed_tokens.weight has shape [7, 5], expected [5, 7]", path, __LINE__);

    memcpy(t, TENSORS, sizeof t);
    t[1].ndim = 2, t[1].shape[1] = 1; /* [13] stored, [13, 1] expected */
    memset(&err, 0, sizeof err);
    rc = fsdp_ckpt_read(MPI_COMM_WORLD, path, t, NT, r.pieces, r.num, &err);
    expect_failure(rc, &err, "model.norm.weight has shape [13], expected [13, 1]", NULL, __LINE__);

    memcpy(t, TENSORS, sizeof t);
    t[3].name = "model.layers.9.nope";
    memset(&err, 0, sizeof err);
    rc = fsdp_ckpt_read(MPI_COMM_WORLD, path, t, NT, r.pieces, r.num, &err);
    expect_failure(rc, &err, "model.layers.9.nope is missing", NULL, __LINE__);
    free_pieces(&r);
}

/* A copy of the checkpoint cut to half its size. */
static void test_bad_files(const char *good) {
    char trunc[1200], missing[1200], text[1200], foreign[1200], newer[1200];
    path_of(trunc, sizeof trunc, "truncated.h5");
    path_of(missing, sizeof missing, "missing.h5");
    path_of(text, sizeof text, "text.h5");
    path_of(foreign, sizeof foreign, "foreign.h5");
    path_of(newer, sizeof newer, "newer.h5");
    if (rank == 0) {
        FILE *in = fopen(good, "rb"), *out = fopen(trunc, "wb");
        struct stat st;
        stat(good, &st);
        char *buf = malloc((size_t)st.st_size);
        size_t got = fread(buf, 1, (size_t)st.st_size, in);
        fwrite(buf, 1, got / 2, out);
        free(buf);
        fclose(in);
        fclose(out);
        FILE *f = fopen(text, "w");
        fputs("this is not HDF5\n", f);
        fclose(f);
        /* Real HDF5 files that are not fsdp.c checkpoints, written serially. */
        hid_t file = H5Fcreate(foreign, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
        H5Fclose(file);
        file = H5Fcreate(newer, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
        hid_t space = H5Screate(H5S_SCALAR), type = H5Tcopy(H5T_C_S1);
        H5Tset_size(type, strlen(FSDP_CKPT_FORMAT));
        hid_t a = H5Acreate2(file, "format", type, space, H5P_DEFAULT, H5P_DEFAULT);
        H5Awrite(a, type, FSDP_CKPT_FORMAT); /* fixed-length, as other writers might store it */
        H5Aclose(a);
        long long v = 3;
        a = H5Acreate2(file, "format_version", H5T_STD_I32LE, space, H5P_DEFAULT, H5P_DEFAULT);
        H5Awrite(a, H5T_NATIVE_LLONG, &v);
        H5Aclose(a);
        H5Tclose(type);
        H5Sclose(space);
        H5Fclose(file);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    fsdp_ckpt_meta meta;
    fsdp_err err = {0};
    int rc = fsdp_ckpt_read_meta(MPI_COMM_WORLD, trunc, &meta, &err);
    expect_failure(rc, &err, "is truncated or not an HDF5 file", trunc, __LINE__);
    piece_set r;
    make_pieces(&r, 1, 0, 1);
    memset(&err, 0, sizeof err);
    rc = fsdp_ckpt_read(MPI_COMM_WORLD, trunc, TENSORS, NT, r.pieces, r.num, &err);
    expect_failure(rc, &err, "is truncated or not an HDF5 file", trunc, __LINE__);
    free_pieces(&r);
    memset(&err, 0, sizeof err);
    rc = fsdp_ckpt_read_meta(MPI_COMM_WORLD, missing, &meta, &err);
    expect_failure(rc, &err, "no such file", missing, __LINE__);
    memset(&err, 0, sizeof err);
    rc = fsdp_ckpt_read_meta(MPI_COMM_WORLD, text, &meta, &err);
    expect_failure(rc, &err, "is truncated or not an HDF5 file", text, __LINE__);
    memset(&err, 0, sizeof err);
    rc = fsdp_ckpt_read_meta(MPI_COMM_WORLD, foreign, &meta, &err);
    expect_failure(rc, &err, "is not an fsdp.c checkpoint", foreign, __LINE__);
    memset(&err, 0, sizeof err);
    rc = fsdp_ckpt_read_meta(MPI_COMM_WORLD, newer, &meta, &err);
    expect_failure(rc, &err, "format version 3", newer, __LINE__);
    memset(&err, 0, sizeof err);
    rc = fsdp_ckpt_read_meta(MPI_COMM_WORLD, dir, &meta, &err);
    expect_failure(rc, &err, "is a directory", NULL, __LINE__);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) remove(trunc), remove(text), remove(foreign), remove(newer);
}

static void test_write_errors(const char *path) {
    piece_set w;
    fsdp_ckpt_meta meta;
    sample_meta(&meta, "{}");
    fsdp_err err = {0};
    char bad_path[1200];
    path_of(bad_path, sizeof bad_path, "no/such/dir/ckpt.h5");
    make_pieces(&w, 0, 1, 1);
    int rc = fsdp_ckpt_write(MPI_COMM_WORLD, bad_path, TENSORS, NT, w.pieces, w.num, &meta, &err);
    expect_failure(rc, &err, "no/such/dir/ckpt.h5.tmp", "H5Fcreate failed", __LINE__);

    /* A bad piece on the last rank only: every rank fails with that rank's message, nothing is written. */
    char other[1200];
    path_of(other, sizeof other, "other.h5");
    if (rank == size - 1) w.pieces[0].count = numel(w.pieces[0].tensor) + 1;
    memset(&err, 0, sizeof err);
    rc = fsdp_ckpt_write(MPI_COMM_WORLD, other, TENSORS, NT, w.pieces, w.num, &meta, &err);
    char want[64];
    snprintf(want, sizeof want, "rank %d: piece", size - 1);
    expect_failure(rc, &err, want, "outside", __LINE__);
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(!exists(other) && count_files_with(".tmp") == 0);
    free_pieces(&w);

    /* Attributes that a reader would refuse are refused before anything is written. */
    make_pieces(&w, 0, 1, 1);
    meta.config_json = NULL;
    memset(&err, 0, sizeof err);
    rc = fsdp_ckpt_write(MPI_COMM_WORLD, other, TENSORS, NT, w.pieces, w.num, &meta, &err);
    expect_failure(rc, &err, "attribute 'config' is not a JSON object", NULL, __LINE__);
    meta.config_json = "{}";
    meta.samples_seen = -3;
    memset(&err, 0, sizeof err);
    rc = fsdp_ckpt_write(MPI_COMM_WORLD, other, TENSORS, NT, w.pieces, w.num, &meta, &err);
    expect_failure(rc, &err, "attribute 'samples_seen' is -3", NULL, __LINE__);
    meta.samples_seen = 1 << 20;
    CHECK(!exists(other) && count_files_with(".tmp") == 0);

    /* Overwriting an existing checkpoint replaces it. */
    meta.step = 99;
    memset(&err, 0, sizeof err);
    CHECK(fsdp_ckpt_write(MPI_COMM_WORLD, path, TENSORS, NT, w.pieces, w.num, &meta, &err) == 0);
    free_pieces(&w);
    fsdp_ckpt_meta back;
    CHECK(fsdp_ckpt_read_meta(MPI_COMM_WORLD, path, &back, &err) == 0);
    CHECK(back.step == 99 && back.config_json && !strcmp(back.config_json, "{}") && back.format_version == 2);
    fsdp_ckpt_meta_free(&back);
    CHECK(count_files_with(".tmp") == 0);
}

static void touch(const char *name) {
    char p[1200];
    path_of(p, sizeof p, name);
    FILE *f = fopen(p, "w");
    fclose(f);
}

static void write_latest_raw(const char *content) {
    char p[1200];
    path_of(p, sizeof p, "latest");
    FILE *f = fopen(p, "w");
    fputs(content, f);
    fclose(f);
}

/* The directory helpers run on rank 0 only. */
static void test_directory(void) {
    if (rank != 0) return;
    char saved[1024], sub[1100], out[1200], want[1200];
    memcpy(saved, dir, sizeof saved);
    snprintf(dir, sizeof dir, "%.1000s/dirtest", saved);
    CHECK(mkdir(dir, 0755) == 0);
    fsdp_err err = {0};
    CHECK(fsdp_ckpt_find_latest(dir, out, sizeof out, &err) == 0);
    snprintf(sub, sizeof sub, "%s/none", dir);
    CHECK(fsdp_ckpt_find_latest(sub, out, sizeof out, &err) == 0);
    const char *names[] = {"step-00000001.h5", "step-00000002.h5", "step-00000010.h5", "step-00000003.h5",
                           "step-100000000.h5"};
    for (int i = 0; i < 5; i++) touch(names[i]);
    touch("step-00000004.h5.tmp");
    touch("notes.txt");
    touch("step-x.h5");
    CHECK(fsdp_ckpt_set_latest(dir, "step-100000000.h5", &err) == 0);
    CHECK(fsdp_ckpt_find_latest(dir, out, sizeof out, &err) == 1);
    snprintf(want, sizeof want, "%s/step-100000000.h5", dir);
    CHECK(!strcmp(out, want));
    CHECK(fsdp_ckpt_find_latest(dir, out, 10, &err) == -1); /* no room */
    CHECK(fsdp_ckpt_prune(dir, 0, &err) == 0 && count_files_with(".h5") == 6);
    CHECK(fsdp_ckpt_prune(dir, 2, &err) == 0);
    char p[1200];
    path_of(p, sizeof p, "step-00000010.h5");
    CHECK(exists(p));
    path_of(p, sizeof p, "step-100000000.h5");
    CHECK(exists(p));
    path_of(p, sizeof p, "step-00000003.h5");
    CHECK(!exists(p));
    path_of(p, sizeof p, "step-00000004.h5.tmp");
    CHECK(exists(p));
    path_of(p, sizeof p, "notes.txt");
    CHECK(exists(p));
    path_of(p, sizeof p, "step-x.h5");
    CHECK(exists(p));
    /* `latest` is never pruned, even when it is not the newest. */
    CHECK(fsdp_ckpt_set_latest(dir, "step-00000010.h5", &err) == 0);
    CHECK(fsdp_ckpt_prune(dir, 1, &err) == 0);
    path_of(p, sizeof p, "step-00000010.h5");
    CHECK(exists(p));
    path_of(p, sizeof p, "step-100000000.h5");
    CHECK(exists(p));
    CHECK(count_files_with(".tmp") == 1);

    memset(&err, 0, sizeof err);
    CHECK(fsdp_ckpt_set_latest(dir, "../elsewhere.h5", &err) == -1 && strstr(err.msg, "not a file name"));
    write_latest_raw("");
    memset(&err, 0, sizeof err);
    CHECK(fsdp_ckpt_find_latest(dir, out, sizeof out, &err) == -1 && strstr(err.msg, "latest: malformed"));
    write_latest_raw("a/b.h5\n");
    memset(&err, 0, sizeof err);
    CHECK(fsdp_ckpt_find_latest(dir, out, sizeof out, &err) == -1 && strstr(err.msg, "malformed"));
    write_latest_raw("step-00000077.h5\n");
    memset(&err, 0, sizeof err);
    CHECK(fsdp_ckpt_find_latest(dir, out, sizeof out, &err) == -1 && strstr(err.msg, "does not exist"));
    memset(&err, 0, sizeof err);
    /* Without a valid 'latest' nothing is known to be verified: pruning deletes nothing. */
    CHECK(fsdp_ckpt_prune(dir, 1, &err) == 0 && count_files_with(".h5") == 3);
    CHECK(fsdp_ckpt_prune(sub, 2, &err) == 0);
    /* Stale temporaries go, other files stay. */
    CHECK(fsdp_ckpt_remove_stale(dir, NULL, &err) == 1 && count_files_with(".tmp") == 0);
    fsdp_ckpt_file *files = NULL;
    int nfiles = 0;
    CHECK(fsdp_ckpt_list(dir, &files, &nfiles, &err) == 0 && nfiles == 2 && files[0].step == 100000000 &&
          files[1].step == 10);
    free(files);
    const char *left[] = {"step-00000010.h5", "step-100000000.h5", "notes.txt", "step-x.h5", "latest", "none"};
    for (int i = 0; i < 6; i++) {
        path_of(p, sizeof p, left[i]);
        remove(p);
    }
    CHECK(rmdir(dir) == 0);
    memcpy(dir, saved, sizeof saved);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    fsdp_set_rank(rank, size);
    if (rank == 0) {
        const char *tmp = getenv("FSDP_TEST_TMP") ? getenv("FSDP_TEST_TMP") : "/tmp";
        snprintf(dir, sizeof dir, "%s/test_checkpoint_%d", tmp, (int)getpid());
        if (mkdir(dir, 0755)) perror(dir);
    }
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    char path[1200];
    path_of(path, sizeof path, "step-00000007.h5");

    test_round_trip(path, NULL);
    test_round_trip(path, rank == 1 ? "1" : "7"); /* other thread counts, not the same on every rank */
    test_shape_errors(path);
    test_bad_files(path);
    test_write_errors(path);
    MPI_Barrier(MPI_COMM_WORLD);
    if (getenv("FSDP_TEST_KEEP_CHECKPOINT")) {
        if (rank == 0) printf("kept %s\n", path);
    } else if (rank == 0) {
        remove(path);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    test_directory();
    if (rank == 0 && !getenv("FSDP_TEST_KEEP_CHECKPOINT")) rmdir(dir);

    int status = mpi_check_summary("test_checkpoint");
    MPI_Finalize();
    return status;
}
