/* The Markdown of tables.h. Numbers are written the way the course writes them: throughput with
 * thousands separators (48,229), speed-ups as 27.33x, efficiencies as 85.4%. */
#include "tables.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- formatting ---- */

static const char *thousands(double x, char *buf, size_t cap) {
    char digits[64];
    snprintf(digits, sizeof digits, "%.0f", x);
    size_t n = strlen(digits), o = 0;
    for (size_t i = 0; i < n && o + 2 < cap; i++) {
        buf[o++] = digits[i];
        size_t left = n - 1 - i;
        if (left > 0 && left % 3 == 0 && digits[i] != '-') buf[o++] = ',';
    }
    buf[o] = '\0';
    return buf;
}

/* A table cell: '|' would end the cell, so it is escaped. */
static void cell(FILE *fp, const char *text) {
    fputs(" ", fp);
    for (; *text; text++) {
        if (*text == '|') fputc('\\', fp);
        fputc(*text, fp);
    }
    fputs(" |", fp);
}

static void cellf(FILE *fp, const char *fmt, double x) {
    char buf[64];
    snprintf(buf, sizeof buf, fmt, x);
    cell(fp, buf);
}

static void cell_int(FILE *fp, long long x) {
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", x);
    cell(fp, buf);
}

/* GiB: two decimals, or three significant digits below 1 (small models, the CPU backend). */
static void cell_gib(FILE *fp, double x) { cellf(fp, x >= 1 || x == 0 ? "%.2f" : "%.3g", x); }

/* A number, or "-" when there is none. */
static void cellf_or_dash(FILE *fp, int have, const char *fmt, double x) {
    if (have)
        cellf(fp, fmt, x);
    else
        cell(fp, "-");
}

static void cell_tps(FILE *fp, double x) {
    char buf[64];
    cell(fp, thousands(x, buf, sizeof buf));
}

static void header(FILE *fp, const char *const *cols, int n) {
    fputs("|", fp);
    for (int i = 0; i < n; i++) cell(fp, cols[i]);
    fputs("\n|", fp);
    for (int i = 0; i < n; i++) fputs("---|", fp);
    fputc('\n', fp);
}

/* What a rank ran on, in the report's words: runs of the CPU backend are not GPUs (their throughput
 * is per CPU rank, their cost in rank-hours). A report with any GPU run speaks of GPUs, the course's
 * unit; one of CPU runs only, of ranks. */
typedef struct {
    const char *one, *many;  /* "GPU"/"GPUs", "CPU rank"/"CPU ranks" in sentences */
    const char *col, *cols;  /* "GPU"/"GPUs", "rank"/"ranks" in column names */
    char tps[32], hours[48]; /* "tokens/s/GPU", "GPU-hours per 1e9 tokens" */
} units;

static int on_cpu(const fsdp_metrics_summary *s) { return !strncasecmp(s->device, "cpu", 3); }

static units units_of(const fsdp_report_content *c) {
    int gpu = 0;
    for (int i = 0; i < c->num_runs; i++) gpu |= c->runs[i].m.has_summary && !on_cpu(&c->runs[i].m.summary);
    int any = 0;
    for (int i = 0; i < c->num_runs; i++) any |= c->runs[i].m.has_summary;
    units u = gpu || !any ? (units){"GPU", "GPUs", "GPU", "GPUs", "", ""}
                          : (units){"CPU rank", "CPU ranks", "rank", "ranks", "", ""};
    snprintf(u.tps, sizeof u.tps, "tokens/s/%s", u.col);
    snprintf(u.hours, sizeof u.hours, "%s-hours per 1e9 tokens", u.col);
    return u;
}

static const fsdp_report_run *row(const fsdp_report_content *c, const fsdp_experiment *e, int i) {
    return &c->runs[e->rows[i]];
}

/* The two cost cells every table ends with (the second only with a price). */
static void cost_cells(FILE *fp, const fsdp_report_content *c, const fsdp_report_run *r) {
    double gh = fsdp_report_gpu_hours_per_billion(r);
    cellf(fp, "%.2f", gh);
    if (c->opt->gpu_hour_price > 0) cellf(fp, "%.2f", gh * c->opt->gpu_hour_price);
}

static int cost_columns(const fsdp_report_content *c, const units *u, const char **cols, int n, char *price_col,
                        size_t cap) {
    cols[n++] = u->hours;
    if (c->opt->gpu_hour_price > 0) {
        snprintf(price_col, cap, "%s per 1e9 tokens", c->opt->currency);
        cols[n++] = price_col;
    }
    return n;
}

static void image(FILE *fp, const fsdp_report_content *c, const char *alt, const char *slug) {
    if (c->opt->plots) fprintf(fp, "![%s](%s.png)\n\n", alt, slug);
}

/* ---- the experiments ---- */

/* What changed from the previous rung, in the course's words. */
static void rung_change(const fsdp_metrics_summary *p, const fsdp_metrics_summary *s, int prev_rung, char *buf,
                        size_t cap) {
    buf[0] = '\0';
    size_t n = 0;
#define ADD(...) n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, __VA_ARGS__)
    if (strcmp(p->mixed_precision, s->mixed_precision)) ADD("%smixed precision %s", n ? ", " : "", s->mixed_precision);
    if (strcmp(p->model_precision, s->model_precision)) ADD("%s%s model", n ? ", " : "", s->model_precision);
    if (strcmp(p->attn, s->attn)) ADD("%s%s attention", n ? ", " : "", s->attn);
    if (p->mbs != s->mbs) ADD("%smicro-batch %d → %d", n ? ", " : "", p->mbs, s->mbs);
    if (p->grad_accum != s->grad_accum) ADD("%saccumulation %d → %d", n ? ", " : "", p->grad_accum, s->grad_accum);
    if (!n) ADD("same as rung %d (repeat)", prev_rung);
#undef ADD
}

static void ladder(FILE *fp, const fsdp_report_content *c, const fsdp_experiment *e) {
    const fsdp_report_run *first = row(c, e, 0), *last = row(c, e, e->num_rows - 1);
    const fsdp_metrics_summary *s0 = &first->m.summary, *sl = &last->m.summary;
    units u = units_of(c);
    fprintf(fp, "## Ladder: %s on %d %s\n\n", first->model_name, s0->world_size, s0->world_size > 1 ? u.many : u.one);
    fprintf(fp, "Folder `%s`: strategy %s, sequence %d, %s. Rungs in the course's order (mixed precision, bf16 model, "
                "flash attention, larger micro-batch); speed-up over rung 1.\n\n",
            first->group, s0->strategy, s0->seq, s0->device);
    image(fp, c, "ladder", e->slug);
    const char *cols[16] = {"rung", "change", "run", "MBS", "model precision", "mixed precision", "attention",
                            u.tps, "speed-up", "max reserved GiB"};
    char price_col[64];
    int ncol = cost_columns(c, &u, cols, 10, price_col, sizeof price_col);
    header(fp, cols, ncol);
    double base = s0->tokens_per_s_per_gpu;
    for (int i = 0; i < e->num_rows; i++) {
        const fsdp_report_run *r = row(c, e, i);
        const fsdp_metrics_summary *s = &r->m.summary;
        char change[256] = "baseline";
        if (i) rung_change(&row(c, e, i - 1)->m.summary, s, i, change, sizeof change);
        fputs("|", fp);
        cell_int(fp, i + 1);
        cell(fp, change);
        cell(fp, r->short_name);
        cell_int(fp, s->mbs);
        cell(fp, s->model_precision);
        cell(fp, s->mixed_precision);
        cell(fp, s->attn);
        cell_tps(fp, s->tokens_per_s_per_gpu);
        cellf(fp, "%.2fx", base > 0 ? s->tokens_per_s_per_gpu / base : 0.0);
        cell_gib(fp, s->max_reserved_gib);
        cost_cells(fp, c, r);
        fputc('\n', fp);
    }
    fprintf(fp, "\n**Rung 1 → rung %d: %.2fx throughput, %.2f → %.2f GiB, micro-batch %d → %d.**\n\n", e->num_rows,
            base > 0 ? sl->tokens_per_s_per_gpu / base : 0.0, s0->max_reserved_gib, sl->max_reserved_gib, s0->mbs,
            sl->mbs);
}

static void strategies(FILE *fp, const fsdp_report_content *c, const fsdp_experiment *e) {
    const fsdp_report_run *first = row(c, e, 0);
    const fsdp_metrics_summary *s0 = &first->m.summary;
    units u = units_of(c);
    fprintf(fp, "## Sharding strategies: %s on %d %s (%d node%s × %d)\n\n", first->model_name, s0->world_size,
            s0->world_size > 1 ? u.many : u.one, s0->nodes, s0->nodes > 1 ? "s" : "", s0->ranks_per_node);
    fprintf(fp, "Folder `%s`: micro-batch %d, sequence %d, %s model, mixed precision %s, %s attention, %s. "
                "Throughput relative to %s.",
            first->group, s0->mbs, s0->seq, s0->model_precision, s0->mixed_precision, s0->attn, s0->device,
            s0->strategy);
    if (s0->nodes == 1) fputs(" On one node HYBRID shards like FULL (its replica group is 1).", fp);
    fputs("\n\n", fp);
    image(fp, c, "strategies", e->slug);
    const char *cols[16] = {"strategy", "run", u.tps, "total tokens/s", "relative", "max reserved GiB"};
    char price_col[64];
    int ncol = cost_columns(c, &u, cols, 6, price_col, sizeof price_col);
    header(fp, cols, ncol);
    double base = s0->tokens_per_s_per_gpu;
    for (int i = 0; i < e->num_rows; i++) {
        const fsdp_report_run *r = row(c, e, i);
        const fsdp_metrics_summary *s = &r->m.summary;
        fputs("|", fp);
        cell(fp, s->strategy);
        cell(fp, r->short_name);
        cell_tps(fp, s->tokens_per_s_per_gpu);
        cell_tps(fp, s->tokens_per_s_per_gpu * s->world_size);
        cellf(fp, "%.2fx", base > 0 ? s->tokens_per_s_per_gpu / base : 0.0);
        cell_gib(fp, s->max_reserved_gib);
        cost_cells(fp, c, r);
        fputc('\n', fp);
    }
    fputc('\n', fp);
}

static void scaling(FILE *fp, const fsdp_report_content *c, const fsdp_experiment *e) {
    const fsdp_report_run *first = row(c, e, 0);
    const fsdp_metrics_summary *s0 = &first->m.summary, *sl = &row(c, e, e->num_rows - 1)->m.summary;
    units u = units_of(c);
    fprintf(fp, "## Scaling: %s, %s, %d to %d %s\n\n", first->model_name, s0->strategy, s0->world_size,
            sl->world_size, u.many);
    fprintf(fp, "Folder `%s`: micro-batch %d per %s (the global batch grows with the %s, as in the course), "
                "sequence %d, %s model, mixed precision %s, %s attention, %s. Speed-up = total throughput over the "
                "%d-%s run's; efficiency = speed-up / (%s / %d) = per-%s throughput over the %d-%s run's.\n\n",
            first->group, s0->mbs, u.one, u.many, s0->seq, s0->model_precision, s0->mixed_precision, s0->attn,
            s0->device, s0->world_size, u.col, u.cols, s0->world_size, u.col, s0->world_size, u.col);
    image(fp, c, "scaling", e->slug);
    const char *cols[16] = {u.cols, "nodes", "run", u.tps, "total tokens/s", "speed-up", "efficiency",
                            "max reserved GiB", "global batch"};
    char price_col[64];
    int ncol = cost_columns(c, &u, cols, 9, price_col, sizeof price_col);
    header(fp, cols, ncol);
    double base = s0->tokens_per_s_per_gpu;
    for (int i = 0; i < e->num_rows; i++) {
        const fsdp_report_run *r = row(c, e, i);
        const fsdp_metrics_summary *s = &r->m.summary;
        double speedup = base > 0 ? s->tokens_per_s_per_gpu * s->world_size / (base * s0->world_size) : 0.0;
        fputs("|", fp);
        cell_int(fp, s->world_size);
        cell_int(fp, s->nodes);
        cell(fp, r->short_name);
        cell_tps(fp, s->tokens_per_s_per_gpu);
        cell_tps(fp, s->tokens_per_s_per_gpu * s->world_size);
        cellf(fp, "%.2fx", speedup);
        cellf(fp, "%.1f%%", base > 0 ? 100.0 * s->tokens_per_s_per_gpu / base : 0.0);
        cell_gib(fp, s->max_reserved_gib);
        cell_int(fp, s->global_batch);
        cost_cells(fp, c, r);
        fputc('\n', fp);
    }
    double speedup = base > 0 ? sl->tokens_per_s_per_gpu * sl->world_size / (base * s0->world_size) : 0.0;
    fprintf(fp, "\n**From %d to %d %s: %.2fx speed-up, %.1f%% efficiency.**\n\n", s0->world_size, sl->world_size,
            u.many, speedup, base > 0 ? 100.0 * sl->tokens_per_s_per_gpu / base : 0.0);
    char cost_slug[300];
    snprintf(cost_slug, sizeof cost_slug, "%s-cost", e->slug);
    image(fp, c, "cost per 1e9 tokens against GPUs", cost_slug);
}

/* ---- cost, losses, runs ---- */

static const fsdp_report_content *g_content; /* qsort has no context argument */

static int by_gpu_hours(const void *a, const void *b) {
    double x = fsdp_report_gpu_hours_per_billion(&g_content->runs[*(const int *)a]);
    double y = fsdp_report_gpu_hours_per_billion(&g_content->runs[*(const int *)b]);
    return (x > y) - (x < y);
}

static void cost(FILE *fp, const fsdp_report_content *c) {
    int *order = malloc((size_t)(c->num_runs ? c->num_runs : 1) * sizeof *order), n = 0;
    if (!order) return;
    for (int i = 0; i < c->num_runs; i++)
        if (c->runs[i].m.has_summary && c->runs[i].m.summary.tokens_per_s_per_gpu > 0) order[n++] = i;
    g_content = c;
    qsort(order, (size_t)n, sizeof *order, by_gpu_hours);
    units u = units_of(c);
    fputs("## Cost per billion tokens\n\n", fp);
    fprintf(fp, "Under linear billing a run on N %s for T hours costs N × T %s-hours, and 1e9 tokens take "
                "1e9 / (%s × N) seconds, so %s = 1e9 / (%s × 3600): cost follows per-%s throughput, while the "
                "wall-clock time also falls with N.",
            u.many, u.col, u.tps, u.hours, u.tps, u.col);
    if (c->opt->gpu_hour_price > 0)
        fprintf(fp, " Price: %g %s per %s-hour.", c->opt->gpu_hour_price, c->opt->currency, u.col);
    else
        fprintf(fp, " No price given (--gpu-hour-price): %s-hours only.", u.col);
    fputs(" Cheapest first.\n\n", fp);
    const char *cols[16] = {"run", u.cols, u.tps};
    char price_col[64];
    int ncol = cost_columns(c, &u, cols, 3, price_col, sizeof price_col);
    cols[ncol++] = "hours for 1e9 tokens";
    header(fp, cols, ncol);
    for (int k = 0; k < n; k++) {
        const fsdp_report_run *r = &c->runs[order[k]];
        fputs("|", fp);
        cell(fp, r->name);
        cell_int(fp, r->m.summary.world_size);
        cell_tps(fp, r->m.summary.tokens_per_s_per_gpu);
        cost_cells(fp, c, r);
        cellf(fp, "%.2f", fsdp_report_gpu_hours_per_billion(r) / r->m.summary.world_size);
        fputc('\n', fp);
    }
    fputc('\n', fp);
    free(order);
}

static void losses(FILE *fp, const fsdp_report_content *c) {
    if (!c->num_losses) return;
    fputs("## Loss curves\n\nTraining loss per optimizer step (validation loss, where the run recorded `eval_loss`, "
          "as dashed lines with points).\n\n",
          fp);
    for (int i = 0; i < c->num_losses; i++) {
        fprintf(fp, "### `%s`\n\n", c->losses[i].group);
        image(fp, c, "loss curves", c->losses[i].slug);
    }
}

static void runs(FILE *fp, const fsdp_report_content *c) {
    fputs("## Runs\n\n", fp);
    units u = units_of(c);
    char tflops[32];
    snprintf(tflops, sizeof tflops, "TFLOP/s/%s", u.col);
    const char *cols[] = {"run", "model", u.cols, "nodes × ranks", "strategy", "MBS × accumulation", "seq",
                          "model / mixed precision", "attention", "steps", u.tps, tflops, "MFU",
                          "max reserved GiB", "last loss", "last validation loss"};
    header(fp, cols, (int)(sizeof cols / sizeof cols[0]));
    int unfinished = 0;
    for (int i = 0; i < c->num_runs; i++) {
        const fsdp_report_run *r = &c->runs[i];
        const fsdp_metrics_summary *s = &r->m.summary;
        if (!r->m.has_summary) {
            unfinished += r->m.num_records > 0; /* a file of `fsdp eval` records alone is no run */
            continue;
        }
        char buf[128];
        fputs("|", fp);
        cell(fp, r->name);
        cell(fp, r->model_name);
        cell_int(fp, s->world_size);
        snprintf(buf, sizeof buf, "%d × %d", s->nodes, s->ranks_per_node);
        cell(fp, buf);
        cell(fp, s->strategy);
        snprintf(buf, sizeof buf, "%d × %d", s->mbs, s->grad_accum);
        cell(fp, buf);
        cell_int(fp, s->seq);
        snprintf(buf, sizeof buf, "%s / %s", s->model_precision, s->mixed_precision);
        cell(fp, buf);
        cell(fp, s->attn);
        cell_int(fp, s->final_step);
        cell_tps(fp, s->tokens_per_s_per_gpu);
        cellf(fp, "%.3g", s->tflops_per_gpu);
        cellf_or_dash(fp, s->mfu > 0, "%.1f%%", 100.0 * s->mfu);
        cell_gib(fp, s->max_reserved_gib);
        cellf_or_dash(fp, r->m.num_loss, "%.4f", r->m.num_loss ? r->m.loss[r->m.num_loss - 1].value : 0.0);
        cellf_or_dash(fp, r->m.num_eval, "%.4f", r->m.num_eval ? r->m.eval[r->m.num_eval - 1].value : 0.0);
        fputc('\n', fp);
    }
    fputc('\n', fp);
    if (!unfinished) return;
    fputs("### Runs without a summary\n\nThese stopped before their end (out of memory, a failure, a time limit) or "
          "are still running; their folders hold their logs.\n\n",
          fp);
    const char *ucols[] = {"run", "records", "last step"};
    header(fp, ucols, 3);
    for (int i = 0; i < c->num_runs; i++) {
        const fsdp_report_run *r = &c->runs[i];
        if (r->m.has_summary || r->m.num_records == 0) continue;
        fputs("|", fp);
        cell(fp, r->name);
        cell_int(fp, r->m.num_records);
        cellf_or_dash(fp, r->m.num_loss, "%.0f", r->m.num_loss ? r->m.loss[r->m.num_loss - 1].step : 0);
        fputc('\n', fp);
    }
    fputc('\n', fp);
}

/* `fsdp eval` records, wherever they were appended: what was scored, on which data. */
static void evaluations(FILE *fp, const fsdp_report_content *c) {
    int n = 0;
    for (int i = 0; i < c->num_runs; i++) n += c->runs[i].m.num_evaluations;
    if (!n) return;
    fputs("## Evaluations\n\nRecords of `fsdp eval --metrics`: the validation loss of a model or checkpoint, one row "
          "per evaluation.\n\n",
          fp);
    const char *cols[] = {"file", "evaluated", "step", "data", "eval loss", "eval ppl"};
    header(fp, cols, (int)(sizeof cols / sizeof cols[0]));
    for (int i = 0; i < c->num_runs; i++) {
        const fsdp_report_run *r = &c->runs[i];
        for (int k = 0; k < r->m.num_evaluations; k++) {
            const fsdp_metrics_evaluation *e = &r->m.evaluations[k];
            fputs("|", fp);
            cell(fp, r->name);
            cell(fp, e->evaluated[0] ? e->evaluated : "-");
            cell_int(fp, e->step);
            cell(fp, e->data[0] ? e->data : "-");
            cellf_or_dash(fp, isfinite(e->loss), "%.4f", e->loss);
            cellf_or_dash(fp, isfinite(e->ppl), "%.2f", e->ppl);
            fputc('\n', fp);
        }
    }
    fputc('\n', fp);
}

void fsdp_report_write_markdown(FILE *fp, const fsdp_report_content *c) {
    int with_summary = 0;
    for (int i = 0; i < c->num_runs; i++) with_summary += c->runs[i].m.has_summary;
    fputs("# fsdp.c report\n\n", fp);
    fprintf(fp, "%d run%s read from", c->num_runs, c->num_runs == 1 ? "" : "s");
    for (int i = 0; i < c->opt->num_dirs; i++) fprintf(fp, "%s `%s`", i ? "," : "", c->opt->dirs[i]);
    units u = units_of(c);
    fprintf(fp, " (%d with a summary), forming %d experiment%s. Throughput is the steady state in tokens/s per %s "
                "(every step but the first); memory is the largest per-%s reservation; both come from each run's "
                "summary record (`tokens_per_s_per_gpu`, `max_reserved_gib`).%s\n\n",
            with_summary, c->num_exps, c->num_exps == 1 ? "" : "s", u.one, u.col,
            strcmp(u.col, "GPU") ? " Every run here ran on the CPU backend: a rank is an MPI process of CPU threads, "
                                   "not a GPU." : "");
    for (int i = 0; i < c->num_exps; i++) {
        const fsdp_experiment *e = &c->exps[i];
        if (e->kind == FSDP_EXP_LADDER)
            ladder(fp, c, e);
        else if (e->kind == FSDP_EXP_STRATEGIES)
            strategies(fp, c, e);
        else
            scaling(fp, c, e);
    }
    cost(fp, c);
    losses(fp, c);
    runs(fp, c);
    evaluations(fp, c);
}
