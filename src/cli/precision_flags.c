/* The precision and wire flags that `fsdp train` and `fsdp plan` share: --model-precision,
 * --mixed-precision, --reduce-dtype, --gather-dtype and --accumulate, checked and turned into
 * fsdp_train_options (commands.h). */
#include <string.h>

#include "commands.h"

const char *const FSDP_CLI_PRECISIONS[] = {"fp32", "bf16", NULL};
const char *const FSDP_CLI_MIXED[] = {"no", "bf16", NULL};
const char *const FSDP_CLI_REDUCE[] = {"auto", "fp32", "bf16", "int8", NULL};
const char *const FSDP_CLI_GATHER[] = {"auto", "fp32", "bf16", "int8", "fp8", NULL};
const char *const FSDP_CLI_ACCUMULATE[] = {"auto", "local", "sharded", NULL};

int fsdp_cli_precision(const char *command, const fsdp_cli_precision_flags *f, fsdp_train_options *o, fsdp_err *err) {
    o->master_dtype = strcmp(f->model_precision, "bf16") ? FSDP_F32 : FSDP_BF16;
    o->compute_dtype = (o->master_dtype == FSDP_BF16 || !strcmp(f->mixed_precision, "bf16")) ? FSDP_BF16 : FSDP_F32;
    if (!strcmp(f->reduce_dtype, "auto")) o->reduce_dtype = o->master_dtype;
    else fsdp_dtype_parse(f->reduce_dtype, &o->reduce_dtype); /* one of the choices: the parser checked */
    if (!strcmp(f->gather_dtype, "auto")) o->gather_dtype = o->compute_dtype;
    else fsdp_dtype_parse(f->gather_dtype, &o->gather_dtype);
    if (!fsdp_dtype_blockwise(o->gather_dtype) && o->gather_dtype != o->compute_dtype)
        return fsdp_usagef(err,
                           "%s: --gather-dtype %s: gathers send the compute dtype (%s with --mixed-precision %s) or a "
                           "quantized one (int8, fp8)",
                           command, f->gather_dtype, fsdp_dtype_name(o->compute_dtype), f->mixed_precision);
    o->accumulate = !strcmp(f->accumulate, "local")     ? FSDP_ACCUMULATE_LOCAL
                    : !strcmp(f->accumulate, "sharded") ? FSDP_ACCUMULATE_SHARDED
                                                        : FSDP_ACCUMULATE_AUTO;
    return 0;
}
