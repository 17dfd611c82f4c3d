/* --reshard-after-forward: parsed, resolved against the topology and checked (reshard.h). */
#include "reshard.h"

#include <errno.h>
#include <stdlib.h>
#include <strings.h>

int fsdp_reshard_parse(const char *command, const char *text, int *out, fsdp_err *err) {
    if (!strcasecmp(text, "node")) {
        *out = FSDP_RESHARD_NODE;
        return 0;
    }
    char *end = NULL;
    errno = 0;
    long n = strtol(text, &end, 10);
    if (*text && !*end && errno == 0 && n >= 1 && n <= (1 << 20)) {
        *out = (int)n;
        return 0;
    }
    return fsdp_usagef(err, "%s: --reshard-after-forward '%s' is neither 'node' nor a number of ranks (1 or more)",
                       command, text);
}

int fsdp_reshard_resolve(const char *command, fsdp_train_options *o, int world, int node_size, int uniform,
                         fsdp_err *err) {
    int asked = o->reshard_after_forward;
    if (asked == 0) return 0;
    if (o->strategy != FSDP_FULL)
        return fsdp_usagef(err,
                           "%s: --reshard-after-forward needs --strategy FULL, not %s (HYBRID already shards inside "
                           "the node, SHARD_GRAD_OP keeps the gathered units to the backward, NO_SHARD gathers "
                           "nothing)",
                           command, fsdp_strategy_name(o->strategy));
    if (asked == FSDP_RESHARD_NODE) {
        if (!uniform)
            return fsdp_usagef(err, "%s: --reshard-after-forward node needs the same number of ranks on every node "
                                    "(give a number of ranks, or --ranks-per-node)",
                               command);
        if (node_size >= world)
            return fsdp_usagef(err, "%s: --reshard-after-forward node: all %d ranks are on one node, so no gather "
                                    "crosses nodes (leave the flag out)",
                               command, world);
        o->reshard_after_forward = node_size;
        return 0;
    }
    if (asked >= world || world % asked)
        return fsdp_usagef(err, "%s: --reshard-after-forward %d must divide the %d ranks and be smaller than %d "
                                "(%d is FULL itself)",
                           command, asked, world, world, world);
    return 0;
}
