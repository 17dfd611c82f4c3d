/* Grouping runs into experiments by what varies (the rules are in experiments.h). */
#include "experiments.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *fsdp_exp_kind_name(fsdp_exp_kind kind) {
    static const char *const NAMES[] = {"ladder", "strategies", "scaling"};
    return kind >= 0 && kind < FSDP_EXP_KINDS ? NAMES[kind] : "?";
}

double fsdp_report_gpu_hours_per_billion(const fsdp_report_run *run) {
    double tps = run->m.summary.tokens_per_s_per_gpu;
    return tps > 0 ? 1e9 / (tps * 3600.0) : 0.0;
}

void fsdp_report_slugify(const char *text, char *out, size_t cap) {
    size_t n = 0;
    for (const char *p = text; *p && n + 1 < cap; p++) {
        char c = *p;
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
                 c == '-';
        out[n++] = ok ? c : '-';
    }
    out[n] = '\0';
}

/* Which configuration fields each kind lets vary. */
enum {
    F_PRECISION = 1 << 0, /* model and mixed precision, attention */
    F_BATCH = 1 << 1,     /* micro-batch, accumulation */
    F_STRATEGY = 1 << 2,
    F_TOPOLOGY = 1 << 3, /* world size, nodes, ranks per node */
};
static const int VARYING[FSDP_EXP_KINDS] = {F_PRECISION | F_BATCH, F_STRATEGY, F_TOPOLOGY};

/* 1 when a and b agree on every field outside `varying`. */
static int same_key(const fsdp_report_run *a, const fsdp_report_run *b, int varying) {
    const fsdp_metrics_summary *x = &a->m.summary, *y = &b->m.summary;
    if (strcmp(a->group, b->group) || strcmp(x->model, y->model) || x->seq != y->seq || strcmp(x->device, y->device))
        return 0;
    if (!(varying & F_PRECISION) && (strcmp(x->model_precision, y->model_precision) ||
                                     strcmp(x->mixed_precision, y->mixed_precision) || strcmp(x->attn, y->attn)))
        return 0;
    if (!(varying & F_BATCH) && (x->mbs != y->mbs || x->grad_accum != y->grad_accum)) return 0;
    if (!(varying & F_STRATEGY) && strcmp(x->strategy, y->strategy)) return 0;
    if (!(varying & F_TOPOLOGY) &&
        (x->world_size != y->world_size || x->nodes != y->nodes || x->ranks_per_node != y->ranks_per_node))
        return 0;
    return 1;
}

/* ---- table order ---- */

static const fsdp_report_run *g_runs; /* qsort has no context argument */

static int strategy_rank(const char *s) {
    static const char *const ORDER[] = {"FULL", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID"};
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, ORDER[i])) return i;
    return 4;
}

/* N of a run folder named rungN-... (ladder.slurm's names), else -1. */
static int rung_number(const fsdp_report_run *r) {
    const char *p = r->short_name;
    if (strncmp(p, "rung", 4) || p[4] < '0' || p[4] > '9') return -1;
    return atoi(p + 4);
}

static int g_by_rung; /* every run of the ladder is named rungN-... */

/* The ladder climbs in the order of its rung numbers when its runs are named so; otherwise as the
 * course does: mixed precision, then a bf16 model, then flash attention, then larger batches, and
 * identical configurations in their names' order. */
static int ladder_cmp(const void *pa, const void *pb) {
    const fsdp_report_run *a = &g_runs[*(const int *)pa], *b = &g_runs[*(const int *)pb];
    if (g_by_rung && rung_number(a) != rung_number(b)) return rung_number(a) < rung_number(b) ? -1 : 1;
    const fsdp_metrics_summary *x = &a->m.summary, *y = &b->m.summary;
    int kx[4] = {strcmp(x->mixed_precision, "no") != 0, !strcmp(x->model_precision, "bf16"),
                 strcmp(x->attn, "eager") != 0, x->mbs * x->grad_accum};
    int ky[4] = {strcmp(y->mixed_precision, "no") != 0, !strcmp(y->model_precision, "bf16"),
                 strcmp(y->attn, "eager") != 0, y->mbs * y->grad_accum};
    for (int i = 0; i < 4; i++)
        if (kx[i] != ky[i]) return kx[i] < ky[i] ? -1 : 1;
    return strcmp(a->name, b->name);
}

static int strategies_cmp(const void *pa, const void *pb) {
    const fsdp_report_run *a = &g_runs[*(const int *)pa], *b = &g_runs[*(const int *)pb];
    int ra = strategy_rank(a->m.summary.strategy), rb = strategy_rank(b->m.summary.strategy);
    if (ra != rb) return ra < rb ? -1 : 1;
    int c = strcmp(a->m.summary.strategy, b->m.summary.strategy);
    return c ? c : strcmp(a->name, b->name);
}

static int scaling_cmp(const void *pa, const void *pb) {
    const fsdp_report_run *a = &g_runs[*(const int *)pa], *b = &g_runs[*(const int *)pb];
    const fsdp_metrics_summary *x = &a->m.summary, *y = &b->m.summary;
    if (x->world_size != y->world_size) return x->world_size < y->world_size ? -1 : 1;
    if (x->nodes != y->nodes) return x->nodes < y->nodes ? -1 : 1;
    return strcmp(a->name, b->name);
}

/* ---- grouping ---- */

/* How many different configurations the members hold (repeats count once). */
static int distinct_configurations(const fsdp_report_run *runs, const int *rows, int n) {
    int distinct = 0;
    for (int i = 0; i < n; i++) {
        int seen = 0;
        for (int j = 0; j < i && !seen; j++) seen = same_key(&runs[rows[i]], &runs[rows[j]], 0);
        distinct += !seen;
    }
    return distinct;
}

static void unique_slug(fsdp_experiment *exps, int n, fsdp_exp_kind kind, const char *group) {
    const char *last = strrchr(group, '/');
    last = last ? last + 1 : group;
    char base[200];
    fsdp_report_slugify(strcmp(last, ".") ? last : "results", base, sizeof base);
    const char *kind_name = fsdp_exp_kind_name(kind);
    char stem[256];
    /* Folders the job scripts write already start with the kind's name. */
    if (!strncmp(base, kind_name, strlen(kind_name)))
        snprintf(stem, sizeof stem, "%s", base);
    else
        snprintf(stem, sizeof stem, "%s-%s", kind_name, base);
    for (int k = 1;; k++) {
        char slug[256];
        if (k == 1)
            snprintf(slug, sizeof slug, "%s", stem);
        else
            snprintf(slug, sizeof slug, "%.240s-%d", stem, k);
        int taken = 0;
        for (int i = 0; i < n && !taken; i++) taken = !strcmp(exps[i].slug, slug);
        if (!taken) {
            snprintf(exps[n].slug, sizeof exps[n].slug, "%s", slug);
            return;
        }
    }
}

int fsdp_report_experiments(const fsdp_report_run *runs, int num_runs, fsdp_experiment **out) {
    fsdp_experiment *exps = NULL;
    int n = 0, cap = 0;
    int *used = fsdp_xcalloc((size_t)(num_runs ? num_runs : 1), sizeof *used, "experiment grouping");
    int *rows = fsdp_xmalloc((size_t)(num_runs ? num_runs : 1) * sizeof *rows, "experiment rows");
    int (*const CMP[FSDP_EXP_KINDS])(const void *, const void *) = {ladder_cmp, strategies_cmp, scaling_cmp};
    for (int kind = 0; kind < FSDP_EXP_KINDS; kind++) {
        memset(used, 0, (size_t)num_runs * sizeof *used);
        for (int i = 0; i < num_runs; i++) {
            if (used[i] || !runs[i].m.has_summary) continue;
            int m = 0;
            for (int j = i; j < num_runs; j++) {
                if (used[j] || !runs[j].m.has_summary || !same_key(&runs[i], &runs[j], VARYING[kind])) continue;
                rows[m++] = j;
                used[j] = 1;
            }
            if (distinct_configurations(runs, rows, m) < 2) continue;
            g_runs = runs;
            g_by_rung = 1;
            for (int k = 0; k < m; k++) g_by_rung &= rung_number(&runs[rows[k]]) >= 0;
            qsort(rows, (size_t)m, sizeof *rows, CMP[kind]);
            FSDP_GROW(exps, n, cap, 8, "the experiments");
            fsdp_experiment *e = &exps[n];
            memset(e, 0, sizeof *e);
            e->kind = (fsdp_exp_kind)kind;
            e->num_rows = m;
            e->rows = fsdp_xmalloc((size_t)m * sizeof *e->rows, "experiment rows");
            memcpy(e->rows, rows, (size_t)m * sizeof *rows);
            unique_slug(exps, n, e->kind, runs[i].group);
            n++;
        }
    }
    free(used);
    free(rows);
    *out = exps;
    return n;
}

void fsdp_report_experiments_free(fsdp_experiment *exps, int num_exps) {
    for (int i = 0; i < num_exps; i++) free(exps[i].rows);
    free(exps);
}

int fsdp_report_loss_groups(const fsdp_report_run *runs, int num_runs, fsdp_loss_group **out) {
    fsdp_loss_group *groups = NULL;
    int n = 0;
    for (int i = 0; i < num_runs; i++) {
        if (runs[i].m.num_loss == 0 && runs[i].m.num_eval == 0) continue;
        int g = 0;
        while (g < n && strcmp(groups[g].group, runs[i].group)) g++;
        if (g == n) {
            fsdp_loss_group *grown = realloc(groups, (size_t)(n + 1) * sizeof *grown);
            if (!grown) fsdp_fatal("out of host memory grouping loss curves");
            groups = grown;
            memset(&groups[n], 0, sizeof groups[n]);
            groups[n].group = runs[i].group;
            groups[n].rows = fsdp_xmalloc((size_t)num_runs * sizeof(int), "loss curve rows");
            const char *last = strrchr(runs[i].group, '/');
            last = last ? last + 1 : runs[i].group;
            char base[200];
            fsdp_report_slugify(strcmp(last, ".") ? last : "results", base, sizeof base);
            for (int k = 1;; k++) {
                if (k == 1)
                    snprintf(groups[n].slug, sizeof groups[n].slug, "loss-%s", base);
                else
                    snprintf(groups[n].slug, sizeof groups[n].slug, "loss-%s-%d", base, k);
                int taken = 0;
                for (int j = 0; j < n && !taken; j++) taken = !strcmp(groups[j].slug, groups[n].slug);
                if (!taken) break;
            }
            n++;
        }
        groups[g].rows[groups[g].num_rows++] = i;
    }
    *out = groups;
    return n;
}

void fsdp_report_loss_groups_free(fsdp_loss_group *groups, int n) {
    for (int i = 0; i < n; i++) free(groups[i].rows);
    free(groups);
}
