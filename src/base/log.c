#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include "error.h"

void fsdp_log(const char *fmt, ...) {
    if (fsdp_rank() > 0) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stdout, fmt, ap);
    va_end(ap);
    fflush(stdout);
}

void fsdp_warn(const char *fmt, ...) {
    if (fsdp_rank() > 0) return;
    fputs("fsdp: notice: ", stderr);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
}

const char *fsdp_bytes_text(double bytes, char buf[32]) {
    if (bytes >= 1024.0 * 1024.0 * 1024.0)
        snprintf(buf, 32, "%.2f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
    else if (bytes >= 1024.0 * 1024.0)
        snprintf(buf, 32, "%.2f MiB", bytes / (1024.0 * 1024.0));
    else if (bytes >= 1024.0)
        snprintf(buf, 32, "%.1f KiB", bytes / 1024.0);
    else
        snprintf(buf, 32, "%.0f B", bytes);
    return buf;
}

double fsdp_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
