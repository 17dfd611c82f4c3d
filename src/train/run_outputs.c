/* The output/input lists of train and eval (run_outputs.h). */
#include "run_outputs.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "../base/agree.h"
#include "../base/files.h"
#include "../base/output_paths.h"
#include "../io/ckpt_dir.h"
#include "../io/export_dir.h"

/* The entries of a checkpoint directory that training writes, replaces or deletes (ckpt_dir.h). */
static int ckpt_dir_manages(const char *name) {
    size_t n = strlen(name);
    return fsdp_ckpt_step_of(name) >= 0 || !strcmp(name, "latest") || !strcmp(name, ".lock") ||
           (n > 4 && !strcmp(name + n - 4, ".tmp"));
}

int fsdp_run_outputs_apart(MPI_Comm comm, const fsdp_train_options *o, fsdp_err *err) {
    int rank = 0;
    FSDP_CHECK_MPI(MPI_Comm_rank(comm, &rank));
    if (rank == 0) {
        const char *data = o->data && strcmp(o->data, "synthetic") ? o->data : NULL;
        const char *resume = o->resume && strcmp(o->resume, "auto") ? o->resume : NULL;
        /* --model and --init-from name a file or a model directory: its files that are read. */
        fsdp_io_path inputs[] = {
            FSDP_IO_FILE("--data", data),
            FSDP_IO_FILE("--eval-data", o->eval_data),
            FSDP_IO_DIR("--model", o->model, fsdp_model_dir_reads),
            FSDP_IO_DIR("--init-from", o->init_from, fsdp_model_dir_reads),
        };
        /* What resuming reads: --ckpt-dir writes it by design, --metrics must not. */
        fsdp_io_path checkpoints[] = {
            FSDP_IO_FILE("--resume", resume),
            FSDP_IO_DIR("--ckpt-dir", o->ckpt_dir, ckpt_dir_manages),
        };
        fsdp_io_path metrics[] = {FSDP_IO_FILE("--metrics", o->metrics)};
        fsdp_io_path ckpt[] = {FSDP_IO_DIR("--ckpt-dir", o->ckpt_dir, ckpt_dir_manages)};
        int n = (int)(sizeof inputs / sizeof inputs[0]), m = (int)(sizeof checkpoints / sizeof checkpoints[0]);
        if (fsdp_outputs_apart(metrics, 1, inputs, n, err) == 0 &&
            fsdp_outputs_apart(metrics, 1, checkpoints, m, err) == 0)
            fsdp_outputs_apart(ckpt, 1, inputs, n, err);
    }
    return fsdp_agree(comm, err);
}

int fsdp_run_outputs_metrics_dir(const char *path, fsdp_err *err) {
    char dir[4096];
    if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir) return fsdp_usagef(err, "--metrics %s: path too long", path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return 0; /* the working folder or the root: there */
    *slash = '\0';
    /* Each prefix in turn: mkdir makes what is missing; one that exists must be a directory. */
    for (char *p = dir + 1;; p++) {
        char c = *p;
        if (c != '/' && c != '\0') continue;
        *p = '\0';
        struct stat st;
        if (stat(dir, &st) == 0) {
            if (!S_ISDIR(st.st_mode))
                return fsdp_usagef(err, "--metrics %s: %s is %s, not a directory", path, dir,
                                   fsdp_file_type_name(st.st_mode));
        } else if (errno != ENOENT || (mkdir(dir, 0777) != 0 && errno != EEXIST)) {
            return fsdp_errf(err, "--metrics %s: cannot create the folder %s: %s (rank 0)", path, dir, strerror(errno));
        }
        *p = c;
        if (!c) return 0;
    }
}
