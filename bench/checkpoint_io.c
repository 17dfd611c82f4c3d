/* Checkpoint I/O alone, without training: every rank writes its slice of a synthetic checkpoint of
 * about GB gigabytes (float32 matrices, weights and both Adam moments, like a FULL-sharded model)
 * into DIR with the checkpoint writer (src/io/checkpoint.h), the file is dropped from the page
 * cache, then read back (the path --resume takes) and verified (fsdp verify's path). Prints one JSON
 * object with the seconds and GB/s of each phase; bench/checkpoint_bench.py runs it beside dd.
 *
 *   mpirun -np 2 build/bench/checkpoint_io DIR 15 [bf16] [pinned]
 *
 * bf16: the ranks hand over bf16 buffers (a bf16 model), written as float32. pinned: the host
 * buffers come from the backend's alloc_host, page-locked on a GPU host (cudaMallocHost), as the
 * trainer's checkpoint snapshot does; without it they are ordinary pageable memory. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "base/log.h"
#include "io/checkpoint.h"

#define ROWS 4096
#define COLS 4096

static void drop_cache(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
        fdatasync(fd);
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    fsdp_set_rank(rank, size);
    if (argc < 3) {
        if (rank == 0) fprintf(stderr, "usage: checkpoint_io DIR GB [bf16] [pinned]\n");
        MPI_Finalize();
        return 2;
    }
    int bf16 = 0, pinned = 0;
    for (int a = 3; a < argc; a++) {
        if (!strcmp(argv[a], "bf16")) {
            bf16 = 1;
        } else if (!strcmp(argv[a], "pinned")) {
            pinned = 1;
        } else {
            if (rank == 0) fprintf(stderr, "checkpoint_io: unknown option '%s' (bf16, pinned)\n", argv[a]);
            MPI_Finalize();
            return 2;
        }
    }
    size_t es = bf16 ? 2 : 4;
    double gb = atof(argv[2]);
    int num = (int)(gb * 1e9 / (3.0 * ROWS * COLS * 4) + 0.5);
    if (num < 1) num = 1;
    char path[4096];
    snprintf(path, sizeof path, "%s/bench-%d.h5", argv[1], size);

    fsdp_ckpt_tensor *tensors = calloc((size_t)num, sizeof *tensors);
    char (*names)[64] = calloc((size_t)num, 64);
    fsdp_ckpt_piece *pieces = calloc((size_t)num, sizeof *pieces);
    int64_t numel = (int64_t)ROWS * COLS, lo = numel * rank / size, hi = numel * (rank + 1) / size, n = hi - lo;
    char *host = NULL;
    size_t host_bytes = (size_t)num * 3 * (size_t)n * es;
    fsdp_backend *be = NULL;
    if (pinned) {
        fsdp_backend_options opts = {.kind = "auto", .act_dtype = FSDP_BF16, .grad_dtype = FSDP_BF16,
                                     .local_rank = rank, .local_size = size};
        fsdp_err berr = {0};
        if (!(be = fsdp_backend_create(&opts, &berr))) {
            fprintf(stderr, "checkpoint_io: rank %d: %s\n", rank, berr.msg);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        host = be->runtime->alloc_host(be, host_bytes, "checkpoint_io buffers");
    } else if (posix_memalign((void **)&host, 4096, host_bytes)) {
        fprintf(stderr, "checkpoint_io: rank %d: out of host memory for %zu bytes\n", rank, host_bytes);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (size_t i = 0; i < (size_t)num * 3 * (size_t)n; i++) {
        uint32_t x = (uint32_t)(i * 2654435761u + (uint32_t)rank * 97u);
        float f = (float)(x % 20001) * 1e-4f - 1.0f;
        if (bf16)
            ((uint16_t *)host)[i] = fsdp_f32_to_bf16(f);
        else
            ((float *)host)[i] = f;
    }
    for (int t = 0; t < num; t++) {
        snprintf(names[t], 64, "model.layers.%d.weight", t);
        tensors[t] = (fsdp_ckpt_tensor){names[t], 2, {ROWS, COLS}};
        char *base = host + (size_t)t * 3 * (size_t)n * es;
        pieces[t] = (fsdp_ckpt_piece){t, lo, n, base, base + (size_t)n * es, base + 2 * (size_t)n * es};
    }
    fsdp_ckpt_meta meta = {0};
    meta.step = 1, meta.samples_seen = 1, meta.world_size = size;
    snprintf(meta.strategy, sizeof meta.strategy, "FULL");
    meta.config_json = "{}", meta.run_json = "{}";
    meta.schedule_json = "{\"type\": \"warmup_cosine\", \"lr\": 0, \"min_lr\": 0, \"warmup\": 0, \"total_steps\": 1, "
                         "\"last_lr\": 0}";
    fsdp_err err = {0};
    double bytes = 3.0 * (double)num * (double)numel * 4.0;

    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = fsdp_now();
    fsdp_ckpt_writer *w = fsdp_ckpt_begin(MPI_COMM_WORLD, path, tensors, num, pieces, num, bf16 ? FSDP_BF16 : FSDP_F32,
                                          &meta, &err);
    double begin_s = fsdp_now() - t0;
    if (!w || fsdp_ckpt_commit((fsdp_ckpt_start(w), w), &err)) {
        if (rank == 0) fprintf(stderr, "checkpoint_io: %s\n", err.msg);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    double write_s = fsdp_now() - t0;

    if (rank == 0) drop_cache(path);
    MPI_Barrier(MPI_COMM_WORLD);
    memset(host, 0, host_bytes);
    t0 = fsdp_now();
    if (fsdp_ckpt_read_as(MPI_COMM_WORLD, path, tensors, num, pieces, num, bf16 ? FSDP_BF16 : FSDP_F32, &err)) {
        if (rank == 0) fprintf(stderr, "checkpoint_io: %s\n", err.msg);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    double read_s = fsdp_now() - t0;

    if (rank == 0) drop_cache(path);
    MPI_Barrier(MPI_COMM_WORLD);
    fsdp_ckpt_info info;
    t0 = fsdp_now();
    if (fsdp_ckpt_verify(MPI_COMM_WORLD, path, &info, &err)) {
        if (rank == 0) fprintf(stderr, "checkpoint_io: %s\n", err.msg);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    double verify_s = fsdp_now() - t0;
    fsdp_ckpt_meta_free(&info.meta);
    if (rank == 0) {
        printf("{\"ranks\": %d, \"bytes\": %.0f, \"host_dtype\": \"%s\", \"host_memory\": \"%s\", \"begin_s\": %.3f, "
               "\"write_s\": %.3f, \"write_gbps\": %.3f, \"read_s\": %.3f, \"read_gbps\": %.3f, \"verify_s\": %.3f, "
               "\"verify_gbps\": %.3f}\n",
               size, bytes, bf16 ? "bf16" : "fp32", be ? (be->kind == FSDP_DEVICE_CUDA ? "pinned" : "backend (cpu)") : "pageable",
               begin_s, write_s, bytes / write_s / 1e9, read_s,
               bytes / read_s / 1e9, verify_s, bytes / verify_s / 1e9);
        unlink(path);
    }
    if (be) {
        be->runtime->free_host(be, host);
        be->runtime->destroy(be);
    } else {
        free(host);
    }
    free(pieces);
    free(names);
    free(tensors);
    MPI_Finalize();
    return 0;
}
