/* The subcommands of the fsdp program. Each parses its own flags (with --help) and returns the
 * process exit status; MPI is initialised before and finalised after. */
#ifndef FSDP_CLI_COMMANDS_H
#define FSDP_CLI_COMMANDS_H

int fsdp_cmd_train(int argc, char **argv);
int fsdp_cmd_verify(int argc, char **argv);

#endif
