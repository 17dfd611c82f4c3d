/* The JSON Lines metrics writer of metrics.h. */
#include "metrics.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jsonio.h"

struct fsdp_metrics {
    FILE *fp;
    char path[1024];
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

int fsdp_metrics_write(fsdp_metrics *m, const json_t *record, fsdp_err *err) {
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
    fclose(m->fp);
    free(m);
}
