/* The output/input rule of output_paths.h: every role expanded to the files it stands for, then
 * compared by device and inode. */
#define _DEFAULT_SOURCE /* dirfd, fstatat */
#include "output_paths.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct {
    dev_t dev;
    ino_t ino;
    const fsdp_io_path *role;
    char entry[256]; /* the directory entry this file is, "" when the role's path is the file */
} file_id;

typedef struct {
    file_id *p;
    size_t n, cap;
} file_ids;

static void add(file_ids *s, const struct stat *st, const fsdp_io_path *role, const char *entry) {
    FSDP_GROW(s->p, s->n, s->cap, 16, "the list of input files");
    file_id *f = &s->p[s->n++];
    f->dev = st->st_dev, f->ino = st->st_ino, f->role = role;
    snprintf(f->entry, sizeof f->entry, "%s", entry);
}

/* The files a role stands for: none when its path does not exist or cannot be looked at (then the
 * command's own opening reports it), and none for a stream that is no regular file. */
static void expand(const fsdp_io_path *role, file_ids *out) {
    struct stat st;
    if (role->stream) {
        if (role->fd >= 0 && fstat(role->fd, &st) == 0 && S_ISREG(st.st_mode)) add(out, &st, role, "");
        return;
    }
    if (!role->path || stat(role->path, &st) != 0) return;
    if (!S_ISDIR(st.st_mode)) {
        add(out, &st, role, "");
        return;
    }
    DIR *d = opendir(role->path);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (role->entries && !role->entries(e->d_name)) continue;
        struct stat es;
        /* Following links: an entry that is a link to an input is that input. */
        if (fstatat(dirfd(d), e->d_name, &es, 0) == 0 && !S_ISDIR(es.st_mode)) add(out, &es, role, e->d_name);
    }
    closedir(d);
}

static void describe(const file_id *f, char *buf, size_t cap) {
    const fsdp_io_path *r = f->role;
    if (r->stream)
        snprintf(buf, cap, "%s", r->flag);
    else if (f->entry[0])
        snprintf(buf, cap, "%s %s (its file %s/%s)", r->flag, r->path, r->path, f->entry);
    else
        snprintf(buf, cap, "%s %s", r->flag, r->path);
}

static void spelling(const file_id *f, char *buf, size_t cap) {
    if (f->entry[0])
        snprintf(buf, cap, "%s/%s", f->role->path, f->entry);
    else
        snprintf(buf, cap, "%s", f->role->path);
}

/* Both named by the same text (or one is a stream, which has no name): no link to point out. */
static int same_spelling(const file_id *a, const file_id *b) {
    if (a->role->stream || b->role->stream) return 1;
    char x[2400], y[2400];
    spelling(a, x, sizeof x);
    spelling(b, y, sizeof y);
    return !strcmp(x, y);
}

int fsdp_outputs_apart(const fsdp_io_path *outputs, int num_outputs, const fsdp_io_path *inputs, int num_inputs,
                       fsdp_err *err) {
    file_ids out = {0}, in = {0};
    for (int i = 0; i < num_outputs; i++) expand(&outputs[i], &out);
    for (int i = 0; i < num_inputs; i++) expand(&inputs[i], &in);
    int rc = 0;
    for (size_t o = 0; o < out.n && rc == 0; o++)
        for (size_t i = 0; i < in.n && rc == 0; i++) {
            if (out.p[o].dev != in.p[i].dev || out.p[o].ino != in.p[i].ino) continue;
            char a[2400], b[2400];
            describe(&out.p[o], a, sizeof a);
            describe(&in.p[i], b, sizeof b);
            const fsdp_io_path *w = out.p[o].role;
            char fix[600];
            if (w->stream)
                snprintf(fix, sizeof fix, "send %s elsewhere", w->flag);
            else
                snprintf(fix, sizeof fix, "give %s another path", w->flag);
            rc = fsdp_usagef(err, "%s would write over %s: both name one file%s; nothing was written: %s", a, b,
                             same_spelling(&out.p[o], &in.p[i]) ? "" : " (through a link or another name)", fix);
        }
    free(out.p);
    free(in.p);
    return rc;
}
