#define _DEFAULT_SOURCE
#include "fault.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"

typedef enum { FAULT_NONE, FAULT_EXIT, FAULT_KILL, FAULT_HANG } fault_mode;

static struct {
    int parsed, rank, step;
    fault_mode mode;
} g_fault;

static void parse(void) {
    g_fault.parsed = 1;
    g_fault.mode = FAULT_NONE;
    const char *text = getenv("FSDP_TEST_FAIL");
    if (!text || !*text) return;
    char mode[16] = "";
    int rank = -1, step = -1, used = 0;
    if (sscanf(text, "%d:%d:%15[a-z]%n", &rank, &step, mode, &used) != 3 || text[used] || rank < 0 || step < 1)
        fsdp_fatal("FSDP_TEST_FAIL=%s: expected RANK:STEP:MODE with MODE exit, kill or hang", text);
    if (!strcmp(mode, "exit")) g_fault.mode = FAULT_EXIT;
    else if (!strcmp(mode, "kill")) g_fault.mode = FAULT_KILL;
    else if (!strcmp(mode, "hang")) g_fault.mode = FAULT_HANG;
    else fsdp_fatal("FSDP_TEST_FAIL=%s: unknown mode '%s' (exit, kill or hang)", text, mode);
    g_fault.rank = rank, g_fault.step = step;
}

void fsdp_fault_point(int step) {
    if (!g_fault.parsed) parse();
    if (g_fault.mode == FAULT_NONE || step != g_fault.step || fsdp_rank() != g_fault.rank) return;
    static const char *names[] = {"none", "exit", "kill", "hang"};
    fprintf(stderr, "fsdp: rank %d: FSDP_TEST_FAIL: injecting '%s' at step %d\n", fsdp_rank(), names[g_fault.mode],
            step);
    fflush(stderr);
    switch (g_fault.mode) {
    case FAULT_EXIT: fsdp_fatal("injected failure at step %d (FSDP_TEST_FAIL)", step);
    case FAULT_KILL: raise(SIGKILL); break;
    case FAULT_HANG:
        for (;;) pause();
    case FAULT_NONE: break;
    }
}
