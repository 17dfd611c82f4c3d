/* Finding and reading the runs of `fsdp report` (experiments.h). */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../base/log.h"
#include "experiments.h"

/* A metrics file, and how much of its path's front to leave out of the run's name. */
typedef struct {
    char *path;
    size_t strip;
} found_file;

typedef struct {
    found_file *v;
    int n, cap;
} path_list;

static void list_add(path_list *l, const char *path, size_t strip) {
    FSDP_GROW(l->v, l->n, l->cap, 64, "the list of metrics files");
    l->v[l->n].path = strdup(path);
    l->v[l->n].strip = strip;
    if (!l->v[l->n].path) fsdp_fatal("out of host memory listing metrics files");
    l->n++;
}

static int ends_with(const char *s, const char *tail) {
    size_t a = strlen(s), b = strlen(tail);
    return a >= b && !strcmp(s + a - b, tail);
}

/* Regular files and folders only: links are not followed, so a loop of links cannot trap the walk. */
static void walk(const char *dir, size_t strip, path_list *out, int depth) {
    if (depth > 64) return;
    DIR *d = opendir(dir);
    if (!d) {
        fsdp_warn("%s: %s (skipped)", dir, strerror(errno));
        return;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char path[4096];
        if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path) continue;
        struct stat st;
        if (lstat(path, &st)) continue;
        if (S_ISDIR(st.st_mode))
            walk(path, strip, out, depth + 1);
        else if (S_ISREG(st.st_mode) && ends_with(e->d_name, ".jsonl"))
            list_add(out, path, strip);
    }
    closedir(d);
}

static int by_path(const void *a, const void *b) {
    return strcmp(((const found_file *)a)->path, ((const found_file *)b)->path);
}

static void model_display_name(const char *model, char *out, size_t cap) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", model);
    size_t n = strlen(tmp);
    while (n > 1 && tmp[n - 1] == '/') tmp[--n] = '\0';
    if (ends_with(tmp, "/config.json")) tmp[n - strlen("/config.json")] = '\0';
    const char *slash = strrchr(tmp, '/');
    snprintf(out, cap, "%s", slash && slash[1] ? slash + 1 : tmp);
}

static void name_run(fsdp_report_run *r, size_t strip) {
    const char *p = r->path + strip;
    while (!strncmp(p, "./", 2)) p += 2;
    snprintf(r->name, sizeof r->name, "%s", p);
    size_t n = strlen(r->name);
    if (!strcmp(r->name, "metrics.jsonl"))
        snprintf(r->name, sizeof r->name, ".");
    else if (ends_with(r->name, "/metrics.jsonl"))
        r->name[n - strlen("/metrics.jsonl")] = '\0';
    else
        r->name[n - strlen(".jsonl")] = '\0';
    char *slash = strrchr(r->name, '/');
    if (slash) {
        snprintf(r->group, sizeof r->group, "%.*s", (int)(slash - r->name), r->name);
        r->short_name = slash + 1;
    } else {
        snprintf(r->group, sizeof r->group, ".");
        r->short_name = r->name;
    }
}

int fsdp_report_collect(const char *const *paths, int num_paths, fsdp_report_run **runs, int *num_runs,
                        fsdp_err *err) {
    *runs = NULL, *num_runs = 0;
    path_list files = {0};
    for (int i = 0; i < num_paths; i++) {
        struct stat st;
        if (stat(paths[i], &st)) {
            fsdp_usagef(err, "report: %s: %s", paths[i], strerror(errno));
            break;
        }
        char base[4096];
        snprintf(base, sizeof base, "%s", paths[i]);
        for (size_t n = strlen(base); n > 1 && base[n - 1] == '/'; n--) base[n - 1] = '\0';
        /* Names start at the folder given: results/ladder-.../rung1-... for `results`, whatever its path. */
        const char *slash = strrchr(base, '/');
        size_t strip = slash && slash[1] ? (size_t)(slash - base + 1) : 0;
        if (S_ISDIR(st.st_mode))
            walk(base, strip, &files, 0);
        else
            list_add(&files, base, 0);
    }
    if (files.n) qsort(files.v, (size_t)files.n, sizeof *files.v, by_path);

    fsdp_report_run *out = files.n ? fsdp_xcalloc((size_t)files.n, sizeof *out, "the runs") : NULL;
    struct stat *seen = files.n ? fsdp_xcalloc((size_t)files.n, sizeof *seen, "run identities") : NULL;
    int n = 0;
    for (int i = 0; i < files.n && !err->failed; i++) {
        /* The same file reached through two arguments is one run. */
        struct stat id;
        if (stat(files.v[i].path, &id) != 0) continue;
        int dup = 0;
        for (int j = 0; j < n && !dup; j++) dup = seen[j].st_dev == id.st_dev && seen[j].st_ino == id.st_ino;
        if (dup) continue;
        fsdp_report_run *r = &out[n];
        snprintf(r->path, sizeof r->path, "%s", files.v[i].path);
        fsdp_err run_err = {0};
        if (fsdp_metrics_read(r->path, &r->m, &run_err)) {
            fsdp_warn("%s (run skipped)", run_err.msg);
            memset(r, 0, sizeof *r);
            continue;
        }
        name_run(r, files.v[i].strip);
        if (r->m.has_summary) model_display_name(r->m.summary.model, r->model_name, sizeof r->model_name);
        seen[n] = id;
        n++;
    }
    for (int i = 0; i < files.n; i++) free(files.v[i].path);
    free(files.v);
    free(seen);
    if (!err->failed && n == 0) {
        fsdp_errf(err, "report: no run with metrics (*.jsonl written by fsdp train --metrics) under %s%s",
                  num_paths ? paths[0] : "(no folder given)", num_paths > 1 ? " and the other folders" : "");
    }
    if (err->failed) {
        fsdp_report_runs_free(out, n);
        return -1;
    }
    *runs = out, *num_runs = n;
    return 0;
}

void fsdp_report_runs_free(fsdp_report_run *runs, int num_runs) {
    for (int i = 0; i < num_runs; i++) fsdp_metrics_run_free(&runs[i].m);
    free(runs);
}
