/* The JSON Lines metrics writer of metrics.h. */
#include "metrics.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jsonio.h"
#include "tfevents.h"

struct fsdp_metrics {
    FILE *fp; /* NULL: TensorBoard only */
    char path[1024];
    fsdp_tfevents *tb;
};

fsdp_metrics *fsdp_metrics_open(const char *path, int append, fsdp_err *err) {
    FILE *fp = fopen(path, append ? "a" : "w");
    if (!fp) {
        fsdp_errf(err, "%s: %s", path, strerror(errno));
        return NULL;
    }
    fsdp_metrics *m = fsdp_xcalloc(1, sizeof *m, "the metrics writer");
    m->fp = fp;
    snprintf(m->path, sizeof m->path, "%s", path);
    return m;
}

int fsdp_metrics_tensorboard(fsdp_metrics **m, const char *dir, int resumed, fsdp_err *err) {
    if (!resumed && fsdp_tfevents_present(dir))
        return fsdp_usagef(err,
                           "--tensorboard %s holds the event files of an earlier run: give each run its own folder "
                           "(TensorBoard shows a folder as one run), or --resume this one", dir);
    fsdp_tfevents *tb = fsdp_tfevents_open(dir, "--tensorboard", err);
    if (!tb) return -1;
    if (!*m) *m = fsdp_xcalloc(1, sizeof **m, "the metrics writer");
    (*m)->tb = tb;
    return 0;
}

enum { MAX_SCALARS = 128 };

/* The numbers of a record as TensorBoard tags (metrics.h). */
static int write_scalars(fsdp_metrics *m, const json_t *record, fsdp_err *err) {
    const char *prefix = json_is_true(json_object_get(record, "summary")) ? "summary"
                         : json_object_get(record, "eval_loss")            ? "eval"
                                                                           : "train";
    const json_t *at = json_object_get(record, prefix[0] == 's' ? "final_step" : "step");
    if (!json_is_integer(at)) return 0; /* not a record of a step */
    char names[MAX_SCALARS][128];
    const char *tags[MAX_SCALARS];
    double values[MAX_SCALARS];
    int n = 0;
    const char *key, *sub;
    const json_t *v, *w;
    json_object_foreach((json_t *)record, key, v) {
        if (!strcmp(key, "step") || !strcmp(key, "final_step")) continue;
        const char *name = !strcmp(prefix, "eval") && !strncmp(key, "eval_", 5) ? key + 5 : key;
        if (json_is_number(v) && n < MAX_SCALARS) {
            snprintf(names[n], sizeof names[n], "%s/%s", prefix, name);
            values[n++] = json_number_value(v);
        } else if (json_is_object(v)) {
            json_object_foreach((json_t *)v, sub, w) {
                if (!json_is_number(w) || n == MAX_SCALARS) continue;
                snprintf(names[n], sizeof names[n], "%s/%s/%s", prefix, name, sub);
                values[n++] = json_number_value(w);
            }
        }
    }
    for (int i = 0; i < n; i++) tags[i] = names[i];
    return fsdp_tfevents_scalars(m->tb, json_integer_value(at), tags, values, n, err);
}

int fsdp_metrics_write(fsdp_metrics *m, const json_t *record, fsdp_err *err) {
    if (m->tb && write_scalars(m, record, err)) return -1;
    if (!m->fp) return 0;
    /* Compact text has no newline (Jansson escapes those inside strings), so one record is one line. */
    char *text = fsdp_json_text(record, 0, 10);
    if (!text) return fsdp_errf(err, "%s: a metrics record could not be encoded", m->path);
    errno = 0;
    int bad = fputs(text, m->fp) == EOF || fputc('\n', m->fp) == EOF || fflush(m->fp) != 0;
    free(text);
    if (bad) return fsdp_errf(err, "%s: cannot write: %s", m->path, errno ? strerror(errno) : "I/O error");
    return 0;
}

void fsdp_metrics_close(fsdp_metrics *m) {
    if (!m) return;
    if (m->fp) fclose(m->fp);
    fsdp_tfevents_close(m->tb);
    free(m);
}
