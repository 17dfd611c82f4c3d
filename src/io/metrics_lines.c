/* The record loop of metrics_lines.h. */
#include "metrics_lines.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/files.h"
#include "../base/log.h"
#include "jsonio.h"

static int blank(const char *line) {
    for (; *line; line++)
        if (*line != ' ' && *line != '\t' && *line != '\n' && *line != '\r') return 0;
    return 1;
}

int fsdp_metrics_each_record(const char *path, fsdp_metrics_visit visit, void *ctx, fsdp_err *err) {
    FILE *fp = fsdp_fopen_regular(path, NULL, err);
    if (!fp) return -1;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long lineno = 0;
    while ((len = getline(&line, &cap, fp)) >= 0) {
        lineno++;
        if (blank(line)) continue;
        char origin[1100];
        snprintf(origin, sizeof origin, "%s: line %ld", path, lineno);
        fsdp_err line_err = {0};
        json_t *rec = fsdp_json_load_text(line, (size_t)len, origin, &line_err);
        if (json_is_object(rec))
            visit(rec, ctx);
        else
            fsdp_warn("%s (line skipped)", rec ? strcat(origin, ": not a JSON object") : line_err.msg);
        json_decref(rec);
    }
    int read_failed = ferror(fp);
    free(line);
    fclose(fp);
    return read_failed ? fsdp_errf(err, "%s: read error", path) : 0;
}
