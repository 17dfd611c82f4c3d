/* --reshard-after-forward (hpZ, src/shard/engine.h): what the flag says, and the size of the
 * secondary group it asks for on a given topology, checked, for `fsdp train` and `fsdp plan` alike.
 *
 * The name and its values follow PyTorch FSDP2's fully_shard(reshard_after_forward=N): "reshard to
 * this world size after forward"; `node` says the size of a node without knowing it. */
#ifndef FSDP_TRAIN_RESHARD_H
#define FSDP_TRAIN_RESHARD_H

#include "../base/error.h"
#include "options.h"

/* "node" (case-insensitive) -> FSDP_RESHARD_NODE, or a whole number of ranks N >= 1 -> N; anything
 * else is one usage line naming `command`, the flag and the text. */
int fsdp_reshard_parse(const char *command, const char *text, int *out, fsdp_err *err);

/* Turns o->reshard_after_forward into the secondary group's size on `world` ranks in nodes of
 * `node_size` (`uniform`: every node has that many) and checks it: only with --strategy FULL, and a
 * divisor of the world smaller than it (`node` on a single node is refused: nothing crosses nodes).
 * 0 when the flag was not given. One usage line naming `command` otherwise. */
int fsdp_reshard_resolve(const char *command, fsdp_train_options *o, int world, int node_size, int uniform,
                         fsdp_err *err);

#endif
