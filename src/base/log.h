/* Console output. fsdp_log prints on rank 0 only (stdout, flushed); fsdp_warn prints a one-line
 * notice on rank 0 to stderr. Both prefix nothing: callers write complete lines. */
#ifndef FSDP_BASE_LOG_H
#define FSDP_BASE_LOG_H

#ifdef __cplusplus
extern "C" {
#endif

void fsdp_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void fsdp_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A byte count for messages: "59.16 GiB", "2.18 MiB", "40.0 KiB", "512 B" (into buf, returned). */
const char *fsdp_bytes_text(double bytes, char buf[32]);
/* Seconds on a monotonic clock. */
double fsdp_now(void);

#ifdef __cplusplus
}
#endif

#endif
