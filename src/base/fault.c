#define _DEFAULT_SOURCE
#include "fault.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "env.h"
#include "error.h"
#include "watchdog.h"

typedef enum {
    FAULT_NONE, FAULT_EXIT, FAULT_KILL, FAULT_HANG, FAULT_NAN, FAULT_NANLOSS, FAULT_POISON,
    FAULT_CKPT_ENOSPC, FAULT_CKPT_EIO, FAULT_CKPT_HANG, FAULT_CKPT_KILL
} fault_mode;

static const char *const MODE_NAMES[] = {"none", "exit", "kill", "hang", "nan", "nanloss", "poison",
                                         "ckpt-enospc", "ckpt-eio", "ckpt-hang", "ckpt-kill"};
static const char *const POINT_NAMES[] = {"create", "write", "commit", "latest"};

static struct {
    int rank; /* -1: every rank */
    int first, last;
    fault_mode mode;
    fsdp_ckpt_point point;
} g_fault;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void bad_value(const char *text, const char *why) {
    fsdp_fatal("FSDP_TEST_FAIL=%s: %s (expected RANK:STEP:MODE, see src/base/fault.h)", text, why);
}

static void parse_mode(const char *text, const char *mode) {
    char base[32];
    const char *at = strchr(mode, '@');
    snprintf(base, sizeof base, "%.*s", at ? (int)(at - mode) : (int)strlen(mode), mode);
    g_fault.mode = FAULT_NONE;
    for (int m = FAULT_EXIT; m <= FAULT_CKPT_KILL; m++)
        if (!strcmp(base, MODE_NAMES[m])) g_fault.mode = (fault_mode)m;
    if (g_fault.mode == FAULT_NONE) bad_value(text, "unknown mode");
    g_fault.point = FSDP_CKPT_AT_WRITE;
    if (!at) return;
    if (g_fault.mode < FAULT_CKPT_ENOSPC) bad_value(text, "only ckpt-* modes take @POINT");
    int found = 0;
    for (int p = 0; p < 4; p++)
        if (!strcmp(at + 1, POINT_NAMES[p])) g_fault.point = (fsdp_ckpt_point)p, found = 1;
    if (!found) bad_value(text, "unknown point (create, write, commit or latest)");
}

static void parse(void) {
    g_fault.mode = FAULT_NONE;
    const char *text = fsdp_env_test_fail();
    if (!text) return;
    char rank[16] = "", mode[48] = "";
    int first = -1, last = -1, used = 0;
    if (sscanf(text, "%15[a-z0-9]:%d-%d:%47[a-z@-]%n", rank, &first, &last, mode, &used) != 4) {
        used = 0;
        if (sscanf(text, "%15[a-z0-9]:%d:%47[a-z@-]%n", rank, &first, mode, &used) != 3) bad_value(text, "malformed");
        last = first;
    }
    if (text[used] || first < 0 || last < first) bad_value(text, "malformed step");
    char *end = NULL;
    if (!strcmp(rank, "all"))
        g_fault.rank = -1;
    else if ((g_fault.rank = (int)strtol(rank, &end, 10)) < 0 || !end || *end || !rank[0])
        bad_value(text, "RANK must be a rank number or 'all'");
    g_fault.first = first, g_fault.last = last;
    parse_mode(text, mode);
    if (first == 0 && (last != 0 || g_fault.mode < FAULT_EXIT || g_fault.mode > FAULT_HANG))
        bad_value(text, "STEP 0 (start-up) is a step of its own and takes exit, kill or hang");
}

static int applies(int step, fault_mode lo, fault_mode hi) {
    pthread_once(&g_once, parse);
    return g_fault.mode >= lo && g_fault.mode <= hi && step >= g_fault.first && step <= g_fault.last &&
           (g_fault.rank < 0 || g_fault.rank == fsdp_rank());
}

static void announce(const char *what, int step) {
    fprintf(stderr, "fsdp: rank %d: FSDP_TEST_FAIL: injecting '%s' at step %d\n", fsdp_rank(), what, step);
    fflush(stderr);
}

static _Noreturn void stall(void) {
    for (;;) pause();
}

void fsdp_fault_point(int step) {
    if (!applies(step, FAULT_EXIT, FAULT_HANG)) return;
    announce(MODE_NAMES[g_fault.mode], step);
    switch (g_fault.mode) {
    case FAULT_EXIT: fsdp_fatal("injected failure at step %d (FSDP_TEST_FAIL)", step);
    case FAULT_KILL: raise(SIGKILL); break;
    case FAULT_HANG: stall();
    default: break;
    }
}

void fsdp_fault_startup(void) {
    pthread_once(&g_once, parse);
    int rank = fsdp_startup_rank() < 0 ? 0 : fsdp_startup_rank(); /* no launcher: a singleton, rank 0 */
    if (g_fault.mode < FAULT_EXIT || g_fault.mode > FAULT_HANG || g_fault.first != 0 ||
        (g_fault.rank >= 0 && g_fault.rank != rank))
        return;
    fprintf(stderr, "fsdp: rank %d: FSDP_TEST_FAIL: injecting '%s' at start-up (before MPI_Init_thread)\n", rank,
            MODE_NAMES[g_fault.mode]);
    fflush(stderr);
    switch (g_fault.mode) {
    case FAULT_EXIT: fsdp_fatal("injected failure at start-up (FSDP_TEST_FAIL)");
    case FAULT_KILL: raise(SIGKILL); break;
    case FAULT_HANG: stall();
    default: break;
    }
}

int fsdp_fault_nonfinite(int step) {
    if (!applies(step, FAULT_NAN, FAULT_NANLOSS)) return 0;
    announce(MODE_NAMES[g_fault.mode], step);
    return g_fault.mode == FAULT_NAN ? 1 : 2;
}

int fsdp_fault_poison(int step) {
    if (!applies(step, FAULT_POISON, FAULT_POISON)) return 0;
    announce("poison", step);
    return 1;
}

int fsdp_fault_ckpt(int step, fsdp_ckpt_point point) {
    if (!applies(step, FAULT_CKPT_ENOSPC, FAULT_CKPT_KILL) || point != g_fault.point) return 0;
    char what[64];
    snprintf(what, sizeof what, "%s@%s", MODE_NAMES[g_fault.mode], POINT_NAMES[point]);
    announce(what, step);
    switch (g_fault.mode) {
    case FAULT_CKPT_ENOSPC: return ENOSPC;
    case FAULT_CKPT_EIO: return EIO;
    case FAULT_CKPT_KILL: raise(SIGKILL); return 0;
    case FAULT_CKPT_HANG: stall();
    default: return 0;
    }
}
