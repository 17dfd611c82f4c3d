/* The signal handlers of preemption.h. Only async-signal-safe calls in the handler: a flag, and
 * for the second signal a prepared message and _exit. */
#define _DEFAULT_SOURCE
#include "preemption.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../base/error.h"

static const int SIGNALS[] = {SIGTERM, SIGINT, SIGUSR1};
enum { NUM_SIGNALS = 3 };

static volatile sig_atomic_t g_first, g_count;
static struct sigaction g_old[NUM_SIGNALS];
static char g_ack[NUM_SIGNALS][160], g_again[NUM_SIGNALS][160];
static int g_installed;

const char *fsdp_signal_name(int sig) {
    switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    default: return "a signal";
    }
}

static int index_of(int sig) {
    for (int i = 0; i < NUM_SIGNALS; i++)
        if (SIGNALS[i] == sig) return i;
    return 0;
}

static void put(const char *text) {
    size_t n = strlen(text);
    while (n > 0) {
        ssize_t w = write(STDERR_FILENO, text, n);
        if (w <= 0) return;
        text += w, n -= (size_t)w;
    }
}

static void on_signal(int sig) {
    int i = index_of(sig);
    if (g_count++ == 0) {
        g_first = sig;
        if (g_ack[i][0]) put(g_ack[i]);
        return;
    }
    put(g_again[i]);
    _exit(128 + sig);
}

void fsdp_preemption_install(void) {
    int rank = fsdp_rank();
    for (int i = 0; i < NUM_SIGNALS; i++) {
        const char *name = fsdp_signal_name(SIGNALS[i]);
        /* Rank 0 acknowledges, so that someone who pressed Ctrl-C knows it was heard. */
        if (rank <= 0)
            snprintf(g_ack[i], sizeof g_ack[i],
                     "fsdp: %s: stopping after this step with a checkpoint (send it again to stop at once)\n", name);
        snprintf(g_again[i], sizeof g_again[i], "fsdp: rank %d: second signal (%s): stopping at once\n", rank, name);
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_signal;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESTART;
        sigaction(SIGNALS[i], &sa, &g_old[i]);
    }
    g_installed = 1;
}

void fsdp_preemption_uninstall(void) {
    if (!g_installed) return;
    for (int i = 0; i < NUM_SIGNALS; i++) sigaction(SIGNALS[i], &g_old[i], NULL);
    g_installed = 0;
}

int fsdp_preemption_signal(void) { return g_first; }
