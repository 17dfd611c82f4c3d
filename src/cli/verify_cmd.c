/* `fsdp verify FILE|DIR`: checks checkpoints completely (every attribute, every tensor against its
 * checksum and for values no checkpoint holds, the tensors against the model the file describes,
 * the record of what trained it against its config) and says what each holds. With mpirun the
 * reading is split between the ranks. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../base/args.h"
#include "../base/error.h"
#include "../base/files.h"
#include "../io/checkpoint.h"
#include "../io/ckpt_dir.h"
#include "../io/hf_config.h"
#include "../model/layout.h"
#include "../train/run_identity.h"
#include "../train/schedule.h"
#include "commands.h"

static const char EPILOGUE[] =
    "A FILE is checked completely: its attributes (format, step and samples_seen in range and consistent with\n"
    "each other and the schedule, unchanged since writing), every tensor against its checksum, every value\n"
    "finite and every second moment (exp_avg_sq) at least 0 whatever the checksums say, the tensors against\n"
    "the model its config describes, and the record of what trained it (its data's tokenizer, the config\n"
    "values that change the computation) against that config. A DIR is every step-*.h5 file in it, and the\n"
    "one 'latest' names.\n"
    "Exit status 0 when everything verifies, 1 when anything does not (one line per defect, naming the file\n"
    "and the tensor or attribute).\n"
    "  fsdp verify ckpt/step-00000100.h5\n"
    "  mpirun -np 4 fsdp verify ckpt        # each rank reads a quarter\n";

static void size_str(double bytes, char *buf, size_t cap) {
    if (bytes >= 1e9)
        snprintf(buf, cap, "%.2f GB", bytes / 1e9);
    else
        snprintf(buf, cap, "%.2f MB", bytes / 1e6);
}

/* The tensors must be the ones the config's model has; *cfg gets the config. */
static int check_model(const char *path, const fsdp_ckpt_info *info, fsdp_model_config *out, char *model, size_t cap,
                       fsdp_err *err) {
    fsdp_model_config cfg;
    fsdp_err cfg_err = {0};
    const char *text = info->meta.config_json ? info->meta.config_json : "";
    if (fsdp_hf_config_parse(text, strlen(text), path, &cfg, &cfg_err))
        return fsdp_errf(err, "checkpoint %s: attribute 'config' does not describe a model fsdp.c knows (%s)", path,
                         cfg_err.msg);
    fsdp_layout layout;
    fsdp_layout_build(&cfg, &layout);
    int params = layout.num_params;
    int64_t numel = layout.total_numel;
    fsdp_layout_free(&layout);
    if (params != info->num_weights || numel != info->weight_elements)
        return fsdp_errf(err,
                         "checkpoint %s holds %d weight tensors of %lld values, but its config describes %d tensors of "
                         "%lld values",
                         path, info->num_weights, (long long)info->weight_elements, params, (long long)numel);
    char desc[256];
    fsdp_model_config_describe(&cfg, desc, sizeof desc);
    double n = (double)numel;
    snprintf(model, cap, "%s, %.2f%s parameters", desc, n >= 1e9 ? n / 1e9 : n / 1e6, n >= 1e9 ? "B" : "M");
    *out = cfg;
    return 0;
}

/* One file: 0 and a line saying what it holds, or -1 and one error line. */
static int verify_file(const char *path, int *step_out) {
    fsdp_err err = {0};
    fsdp_ckpt_info info;
    fsdp_model_config cfg;
    char model[300] = "", identity[900] = "";
    int rc = fsdp_ckpt_verify(MPI_COMM_WORLD, path, &info, &err);
    if (rc == 0) {
        rc = check_model(path, &info, &cfg, model, sizeof model, &err);
        if (rc == 0) rc = fsdp_schedule_check_record(info.meta.schedule_json, info.meta.step, path, &err);
        if (rc == 0) rc = fsdp_identity_verify(path, info.meta.identity_json, &cfg, identity, sizeof identity, &err);
    }
    if (fsdp_rank() <= 0) {
        if (rc) {
            fprintf(stderr, "fsdp: error: %s\n", err.msg);
        } else {
            char size[32];
            size_str((double)info.bytes, size, sizeof size);
            printf("%s: %s: %s; step %lld, %lld samples seen; written by %d rank(s) with %s; %d tensors (%s), %s%s; %s\n",
                   path, info.checksummed ? "ok" : "readable", model, (long long)info.meta.step,
                   (long long)info.meta.samples_seen, info.meta.world_size, info.meta.strategy, info.num_datasets,
                   info.has_optimizer ? "weights and Adam moments" : "weights only", size,
                   info.checksummed ? ", every checksum matches, every value in range"
                                    : "; format version 1: no checksums, the contents cannot be verified",
                   identity);
            fflush(stdout);
        }
        fflush(stderr);
    }
    if (step_out) *step_out = rc ? -1 : (int)info.meta.step;
    if (rc == 0) fsdp_ckpt_meta_free(&info.meta);
    return rc;
}

/* Temporaries of saves that never finished: listed, not judged (the next run there removes them). */
static void list_stale(const char *dir) {
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        char stem[256];
        if (len < 5 || len >= sizeof stem || strcmp(e->d_name + len - 4, ".tmp")) continue;
        snprintf(stem, sizeof stem, "%.*s", (int)(len - 4), e->d_name);
        if (fsdp_ckpt_step_of(stem) >= 0)
            printf("%s/%s: the temporary file of a save that never finished (the next run here removes it)\n", dir,
                   e->d_name);
    }
    if (d) closedir(d);
}

static int verify_dir(const char *dir) {
    fsdp_ckpt_file *files = NULL;
    int n = 0, bad = 0;
    fsdp_err err = {0};
    if (fsdp_ckpt_list(dir, &files, &n, &err)) {
        if (fsdp_rank() <= 0) fprintf(stderr, "fsdp: error: %s\n", err.msg);
        return -1;
    }
    if (n == 0) {
        if (fsdp_rank() <= 0) fprintf(stderr, "fsdp: error: %s holds no checkpoints (no step-*.h5 files)\n", dir);
        free(files);
        return -1;
    }
    char latest[4400] = "", *latest_name = NULL;
    int found = fsdp_ckpt_find_latest(dir, latest, sizeof latest, &err);
    if (found == 1) latest_name = strrchr(latest, '/') + 1;
    int latest_ok = 0;
    for (int i = n - 1; i >= 0; i--) {
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dir, files[i].name);
        int failed = verify_file(path, NULL) != 0;
        bad += failed;
        if (latest_name && !strcmp(latest_name, files[i].name)) latest_ok = !failed;
    }
    if (fsdp_rank() <= 0) {
        if (found < 0) {
            fprintf(stderr, "fsdp: error: %s\n", err.msg);
        } else if (found == 0) {
            printf("%s/latest: none (--resume auto takes the newest step file that verifies)\n", dir);
        } else if (!latest_ok) {
            fprintf(stderr, "fsdp: error: %s/latest names %s, which does not verify\n", dir, latest_name);
        } else {
            printf("%s/latest: %s\n", dir, latest_name);
        }
        list_stale(dir);
    }
    free(files);
    return bad || found < 0 || (found == 1 && !latest_ok) ? -1 : 0;
}

int fsdp_cmd_verify(int argc, char **argv) {
    fsdp_err err = {0};
    fsdp_arg args[1];
    fsdp_arg_spec spec = {"verify", "Check fsdp.c checkpoints completely and say what they hold.",
                          "fsdp verify FILE|DIR", EPILOGUE, args, 0};
    /* One positional argument; everything else goes to the flag parser (--help). */
    const char *target = NULL;
    char **rest = fsdp_xcalloc((size_t)argc + 1, sizeof *rest, "arguments");
    int nrest = 0;
    for (int i = 0; i < argc; i++) {
        if (i > 0 && strncmp(argv[i], "--", 2) && strcmp(argv[i], "-h") && !target)
            target = argv[i];
        else
            rest[nrest++] = argv[i];
    }
    int rc = fsdp_args_parse(&spec, nrest, rest, stdout, &err);
    free(rest);
    if (rc == 1) return 0;
    if (rc < 0) fsdp_exit_error(&err, 0);
    if (!target) {
        fsdp_usagef(&err, "verify: name a checkpoint file or directory (see fsdp verify --help)");
        fsdp_exit_error(&err, 0);
    }
    struct stat st;
    if (stat(target, &st) == 0 && S_ISDIR(st.st_mode)) return verify_dir(target) ? 1 : 0;
    return verify_file(target, NULL) ? 1 : 0;
}
