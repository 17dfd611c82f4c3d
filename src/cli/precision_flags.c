/* The precision and wire flags that `fsdp train` and `fsdp plan` share: --model-precision,
 * --mixed-precision, --reduce-dtype, --gather-dtype and --accumulate, checked and turned into
 * fsdp_train_options (commands.h). */
#include <string.h>

#include "../backend/backend.h"
#include "commands.h"

const char *const FSDP_CLI_PRECISIONS[] = {"fp32", "bf16", NULL};
const char *const FSDP_CLI_MIXED[] = {"auto", "no", "bf16", NULL};
const char *const FSDP_CLI_REDUCE[] = {"auto", "fp32", "bf16", "int8", NULL};
const char *const FSDP_CLI_GATHER[] = {"auto", "fp32", "bf16", "int8", "fp8", NULL};
const char *const FSDP_CLI_ACCUMULATE[] = {"auto", "local", "sharded", NULL};

/* auto: bf16 where it runs on tensor cores (GPUs), fp32 on the CPU backend, where bf16 is emulated (every
 * value rounded in software) and slower; fp32 is also the Hugging Face Trainer's default (bf16=False). */
int fsdp_cli_mixed_bf16(const char *mixed_precision, const char *device) {
    if (strcmp(mixed_precision, "auto")) return !strcmp(mixed_precision, "bf16");
    if (device && !strcmp(device, "cpu")) return 0;
    if (device && !strcmp(device, "cuda")) return 1;
    return fsdp_backend_cuda_available();
}

int fsdp_cli_precision(const char *command, const fsdp_cli_precision_flags *f, fsdp_train_options *o, fsdp_err *err) {
    o->master_dtype = strcmp(f->model_precision, "bf16") ? FSDP_F32 : FSDP_BF16;
    int bf16 = fsdp_cli_mixed_bf16(f->mixed_precision, o->device);
    o->compute_dtype = (o->master_dtype == FSDP_BF16 || bf16) ? FSDP_BF16 : FSDP_F32;
    if (!strcmp(f->reduce_dtype, "auto")) o->reduce_dtype = o->master_dtype;
    else fsdp_dtype_parse(f->reduce_dtype, &o->reduce_dtype); /* one of the choices: the parser checked */
    if (!strcmp(f->gather_dtype, "auto")) o->gather_dtype = o->compute_dtype;
    else fsdp_dtype_parse(f->gather_dtype, &o->gather_dtype);
    if (!fsdp_dtype_blockwise(o->gather_dtype) && o->gather_dtype != o->compute_dtype)
        return fsdp_usagef(err,
                           "%s: --gather-dtype %s: gathers send the compute dtype (%s with --mixed-precision %s) or a "
                           "quantized one (int8, fp8)",
                           command, f->gather_dtype, fsdp_dtype_name(o->compute_dtype), bf16 ? "bf16" : "no");
    o->accumulate = !strcmp(f->accumulate, "local")     ? FSDP_ACCUMULATE_LOCAL
                    : !strcmp(f->accumulate, "sharded") ? FSDP_ACCUMULATE_SHARDED
                                                        : FSDP_ACCUMULATE_AUTO;
    return 0;
}
