/* The subcommands of the fsdp program. Each parses its own flags (with --help) and returns the
 * process exit status; MPI is initialised before and finalised after. */
#ifndef FSDP_CLI_COMMANDS_H
#define FSDP_CLI_COMMANDS_H

#include "../base/error.h"

int fsdp_cmd_train(int argc, char **argv);
int fsdp_cmd_report(int argc, char **argv);
int fsdp_cmd_tokenize(int argc, char **argv);
int fsdp_cmd_prepare(int argc, char **argv);
int fsdp_cmd_plan(int argc, char **argv);

/* --mbs N|auto of `command`: *mbs = N and *is_auto = 0, or *is_auto = 1 (train_cmd.c). */
int fsdp_cli_parse_mbs(const char *command, const char *text, int *mbs, int *is_auto, fsdp_err *err);
/* --dropout P of `command` (text NULL: not given): *set = 1 and *rate = P in [0, 1) (train_cmd.c). */
int fsdp_cli_parse_dropout(const char *command, const char *text, int *set, double *rate, fsdp_err *err);
int fsdp_cmd_export(int argc, char **argv);
int fsdp_cmd_verify(int argc, char **argv);
int fsdp_cmd_generate(int argc, char **argv);
int fsdp_cmd_eval(int argc, char **argv);

#endif
