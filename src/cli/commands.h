/* The subcommands of the fsdp program. Each parses its own flags (with --help) and returns the
 * process exit status; MPI is initialised before and finalised after. */
#ifndef FSDP_CLI_COMMANDS_H
#define FSDP_CLI_COMMANDS_H

#include "../base/error.h"
#include "../train/memory_plan.h"
#include "../train/options.h"

int fsdp_cmd_train(int argc, char **argv);
int fsdp_cmd_report(int argc, char **argv);
int fsdp_cmd_tokenize(int argc, char **argv);
int fsdp_cmd_prepare(int argc, char **argv);
int fsdp_cmd_plan(int argc, char **argv);

/* --mbs N|auto of `command`: *mbs = N and *is_auto = 0, or *is_auto = 1 (train_cmd.c). */
int fsdp_cli_parse_mbs(const char *command, const char *text, int *mbs, int *is_auto, fsdp_err *err);
/* --dropout P of `command` (text NULL: not given): *set = 1 and *rate = P in [0, 1) (train_cmd.c). */
int fsdp_cli_parse_dropout(const char *command, const char *text, int *set, double *rate, fsdp_err *err);
/* The precision and wire flags of train and plan (precision_flags.c): their choices, and the options
 * they give. */
extern const char *const FSDP_CLI_PRECISIONS[], *const FSDP_CLI_MIXED[], *const FSDP_CLI_REDUCE[],
    *const FSDP_CLI_GATHER[], *const FSDP_CLI_ACCUMULATE[];
typedef struct {
    const char *model_precision, *mixed_precision, *reduce_dtype, *gather_dtype, *accumulate;
} fsdp_cli_precision_flags;
#define FSDP_CLI_PRECISION_DEFAULTS {"fp32", "auto", "auto", "auto", "auto"}
/* --mixed-precision auto|no|bf16 on `device` (auto, cpu, cuda): 1 for bf16. auto is bf16 on GPUs and
 * no (fp32) on the CPU backend, where bf16 is emulated and slower (precision_flags.c). */
int fsdp_cli_mixed_bf16(const char *mixed_precision, const char *device);
/* Sets master, compute, reduce and gather dtypes and the accumulation of `o` (o->device set first); a usage error for a
 * --gather-dtype that is neither the compute dtype nor a quantized one. */
int fsdp_cli_precision(const char *command, const fsdp_cli_precision_flags *f, fsdp_train_options *o, fsdp_err *err);
int fsdp_cmd_export(int argc, char **argv);
int fsdp_cmd_verify(int argc, char **argv);
int fsdp_cmd_generate(int argc, char **argv);
int fsdp_cmd_eval(int argc, char **argv);
/* "Llama, OPT, or Qwen2": the families of the registry as transformers names them (family_list.c). */
const char *fsdp_cli_family_list(void);

#endif
