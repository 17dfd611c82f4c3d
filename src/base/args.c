/* Long-flag parsing from a declarative table, with generated --help. */
#include "args.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "decimal.h"

static fsdp_arg *find(fsdp_arg_spec *spec, const char *name, size_t len) {
    for (int i = 0; i < spec->num_args; i++)
        if (strlen(spec->args[i].name) == len && !strncmp(spec->args[i].name, name, len)) return &spec->args[i];
    return NULL;
}

const fsdp_arg *fsdp_args_find(const fsdp_arg_spec *spec, const char *name) {
    return find((fsdp_arg_spec *)spec, name, strlen(name));
}

static int has_range(const fsdp_arg *a) { return a->min <= a->max; }

/* Hugging Face's names (TrainingArguments, run_clm.py, generate()) for what fsdp.c's flags do: a
 * user coming from the Trainer types those first, and "unknown flag" alone sends them to --help to
 * guess. `ours` is the flag (or flag and value) that does it; the pointer is given only when the
 * command has that flag. `hint` replaces it where fsdp.c has no such flag. */
static const struct {
    const char *theirs, *ours, *hint;
} HF_NAMES[] = {
    {"learning_rate", "lr", NULL},
    {"max_steps", "steps", NULL},
    {"num_train_epochs", "epochs", NULL},
    {"per_device_train_batch_size", "mbs", NULL},
    {"per_device_eval_batch_size", "mbs", NULL},
    {"gradient_accumulation_steps", "grad-accum", NULL},
    {"warmup_steps", "warmup", NULL},
    {"max_grad_norm", "clip", NULL},
    {"adam_beta1", "beta1", NULL},
    {"adam_beta2", "beta2", NULL},
    {"adam_epsilon", "adam-eps", NULL},
    {"output_dir", "ckpt-dir", NULL},
    {"save_steps", "ckpt-every", NULL},
    {"save_total_limit", "keep", NULL},
    {"logging_steps", "log-every", NULL},
    {"eval_steps", "eval-every", NULL},
    {"resume_from_checkpoint", "resume", NULL},
    {"model_name_or_path", "init-from", NULL},
    {"train_file", "data", NULL},
    {"validation_file", "eval-data", NULL},
    {"block_size", "seq", NULL},
    {"max_seq_length", "seq", NULL},
    {"bf16", "mixed-precision", " bf16"},
    {"fp16", "mixed-precision", " bf16 (fsdp.c computes in bf16 or fp32, not fp16)"},
    {"gradient_checkpointing", "recompute", " full"},
    {"fsdp", "strategy", " FULL|SHARD_GRAD_OP|NO_SHARD|HYBRID"},
    {"max_new_tokens", "max-new-tokens", NULL},
    {"logging_dir", "tensorboard", NULL},
    {"report_to", "tensorboard", " DIR"},
    {"warmup_ratio", NULL, "fsdp.c takes warm-up in steps: --warmup N"},
    {"lr_scheduler_type", NULL, "fsdp.c's schedule is linear warm-up then cosine decay to --min-lr"},
};

/* "-"/"_" spellings are the same name here: --max-steps and --max_steps both point to --steps. */
static int same_name(const char *a, const char *b, size_t len) {
    size_t i = 0;
    for (; i < len && a[i]; i++) {
        char x = a[i] == '-' ? '_' : a[i], y = b[i] == '-' ? '_' : b[i];
        if (x != y) return 0;
    }
    return i == len && !a[i];
}

/* The unknown flag `--NAME` named by Hugging Face's or another spelling: one line pointing to ours. */
static int unknown_flag(fsdp_arg_spec *spec, const char *name, size_t len, fsdp_err *err) {
    for (int i = 0; i < spec->num_args; i++)
        if (same_name(spec->args[i].name, name, len))
            return fsdp_usagef(err, "%s: unknown flag '--%.*s'; fsdp.c spells it --%s", spec->command, (int)len, name,
                               spec->args[i].name);
    for (size_t k = 0; k < sizeof HF_NAMES / sizeof HF_NAMES[0]; k++) {
        if (!same_name(HF_NAMES[k].theirs, name, len)) continue;
        if (!HF_NAMES[k].ours)
            return fsdp_usagef(err, "%s: unknown flag '--%.*s' (Hugging Face's name): %s", spec->command, (int)len,
                               name, HF_NAMES[k].hint);
        if (!find(spec, HF_NAMES[k].ours, strlen(HF_NAMES[k].ours))) break;
        return fsdp_usagef(err, "%s: --%.*s is Hugging Face's name; fsdp.c calls it --%s%s", spec->command, (int)len,
                           name, HF_NAMES[k].ours, HF_NAMES[k].hint ? HF_NAMES[k].hint : "");
    }
    return fsdp_usagef(err, "%s: unknown flag '--%.*s' (see fsdp %s --help)", spec->command, (int)len, name,
                       spec->command);
}

/* The table's spelling of a choice (matched case-insensitively), or NULL. */
static const char *match_choice(const fsdp_arg *a, const char *value) {
    for (int i = 0; a->choices[i]; i++)
        if (!strcasecmp(a->choices[i], value)) return a->choices[i];
    return NULL;
}

static void choice_list(const fsdp_arg *a, char *buf, size_t cap) {
    buf[0] = 0;
    for (int i = 0; a->choices[i]; i++) {
        size_t used = strlen(buf);
        snprintf(buf + used, cap - used, "%s%s", i ? ", " : "", a->choices[i]);
    }
}

static int set_value(fsdp_arg_spec *spec, fsdp_arg *a, const char *value, fsdp_err *err) {
    char *end = NULL;
    errno = 0;
    switch (a->type) {
    case FSDP_ARG_INT:
    case FSDP_ARG_INT64: {
        long long v = strtoll(value, &end, 10);
        if (!fsdp_plain_decimal(value, 0) || *end || errno)
            return fsdp_usagef(err, "%s: --%s expects an integer, got '%s'", spec->command, a->name, value);
        if (has_range(a) && (v < (long long)a->min || v > (long long)a->max))
            return fsdp_usagef(err, "%s: --%s %lld is out of range [%.0f, %.0f]", spec->command, a->name, v, a->min,
                               a->max);
        if (a->type == FSDP_ARG_INT)
            *(int *)a->dest = (int)v;
        else
            *(int64_t *)a->dest = v;
        break;
    }
    case FSDP_ARG_FLOAT: {
        double v = strtod(value, &end);
        if (!fsdp_plain_decimal(value, 1) || *end || errno || !isfinite(v))
            return fsdp_usagef(err, "%s: --%s expects a decimal number (like 3e-4 or 0.001), got '%s'", spec->command,
                               a->name, value);
        if (has_range(a) && (v < a->min || v > a->max))
            return fsdp_usagef(err, "%s: --%s %g is out of range [%g, %g]", spec->command, a->name, v, a->min, a->max);
        *(double *)a->dest = v;
        break;
    }
    case FSDP_ARG_STRING:
        if (!*value) return fsdp_usagef(err, "%s: --%s expects a value", spec->command, a->name);
        *(const char **)a->dest = value;
        break;
    case FSDP_ARG_CHOICE: {
        const char *c = match_choice(a, value);
        if (!c) {
            char list[512];
            choice_list(a, list, sizeof list);
            return fsdp_usagef(err, "%s: --%s '%s' is not one of: %s", spec->command, a->name, value, list);
        }
        *(const char **)a->dest = c;
        break;
    }
    case FSDP_ARG_BOOL:
        if (!strcasecmp(value, "yes") || !strcasecmp(value, "true") || !strcmp(value, "1"))
            *(int *)a->dest = 1;
        else if (!strcasecmp(value, "no") || !strcasecmp(value, "false") || !strcmp(value, "0"))
            *(int *)a->dest = 0;
        else
            return fsdp_usagef(err, "%s: --%s expects yes or no, got '%s'", spec->command, a->name, value);
        break;
    }
    a->seen = 1;
    return 0;
}

int fsdp_args_parse(fsdp_arg_spec *spec, int argc, char **argv, FILE *help_out, fsdp_err *err) {
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            fsdp_args_print_help(spec, help_out);
            return 1;
        }
        if (strncmp(arg, "--", 2) || !arg[2])
            return fsdp_usagef(err, "%s: unexpected argument '%s' (flags are --name VALUE; see fsdp %s --help)",
                               spec->command, arg, spec->command);
        const char *name = arg + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        fsdp_arg *a = find(spec, name, len);
        if (!a) return unknown_flag(spec, name, len, err);
        if (a->seen) return fsdp_usagef(err, "%s: --%s given twice", spec->command, a->name);
        const char *value;
        if (eq) {
            value = eq + 1;
        } else if (a->type == FSDP_ARG_BOOL) {
            value = "yes";
        } else {
            if (i + 1 >= argc || !strncmp(argv[i + 1], "--", 2))
                return fsdp_usagef(err, "%s: --%s needs a value", spec->command, a->name);
            value = argv[++i];
        }
        if (set_value(spec, a, value, err)) return -1;
    }
    return 0;
}

static void format_default(const fsdp_arg *a, char *buf, size_t cap) {
    buf[0] = 0;
    switch (a->type) {
    case FSDP_ARG_INT: snprintf(buf, cap, " (default %d)", *(const int *)a->dest); break;
    case FSDP_ARG_INT64: snprintf(buf, cap, " (default %lld)", (long long)*(const int64_t *)a->dest); break;
    case FSDP_ARG_FLOAT: snprintf(buf, cap, " (default %g)", *(const double *)a->dest); break;
    case FSDP_ARG_STRING:
    case FSDP_ARG_CHOICE:
        if (*(const char *const *)a->dest) snprintf(buf, cap, " (default %s)", *(const char *const *)a->dest);
        break;
    case FSDP_ARG_BOOL: snprintf(buf, cap, " (default %s)", *(const int *)a->dest ? "yes" : "no"); break;
    }
}

/* Prints `text` wrapped at 100 columns with the given indent. */
static void wrap(FILE *out, const char *text, int indent, int first_col) {
    int col = first_col;
    const char *p = text;
    while (*p) {
        const char *sp = strchr(p, ' ');
        int n = sp ? (int)(sp - p) : (int)strlen(p);
        if (col + n > 100 && col > indent) {
            fprintf(out, "\n%*s", indent, "");
            col = indent;
        }
        fprintf(out, "%.*s", n, p);
        col += n;
        p += n;
        if (*p == ' ') {
            fputc(' ', out);
            col++;
            p++;
        }
    }
}

void fsdp_args_print_help(const fsdp_arg_spec *spec, FILE *out) {
    fprintf(out, "usage: %s\n\n", spec->usage);
    wrap(out, spec->summary, 0, 0);
    fprintf(out, "\n\nflags:\n");
    for (int i = 0; i < spec->num_args; i++) {
        const fsdp_arg *a = &spec->args[i];
        char head[96];
        if (a->type == FSDP_ARG_BOOL)
            snprintf(head, sizeof head, "  --%s", a->name);
        else
            snprintf(head, sizeof head, "  --%s %s", a->name, a->metavar ? a->metavar : "VALUE");
        fprintf(out, "%s", head);
        int col = (int)strlen(head);
        if (col < 30) {
            fprintf(out, "%*s", 30 - col, "");
            col = 30;
        } else {
            fprintf(out, "\n%30s", "");
            col = 30;
        }
        char text[2048], list[512] = "", dflt[256];
        if (a->type == FSDP_ARG_CHOICE) choice_list(a, list, sizeof list);
        format_default(a, dflt, sizeof dflt);
        snprintf(text, sizeof text, "%s%s%s%s%s", a->help, list[0] ? " One of: " : "", list, list[0] ? "." : "", dflt);
        wrap(out, text, 30, col);
        fputc('\n', out);
    }
    fprintf(out, "  --help                      Print this help and exit.\n");
    if (spec->epilogue) {
        fputc('\n', out);
        fputs(spec->epilogue, out);
        if (spec->epilogue[strlen(spec->epilogue) - 1] != '\n') fputc('\n', out);
    }
}
