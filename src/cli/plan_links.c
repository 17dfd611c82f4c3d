/* The link flags of plan and train (plan_links.h). */
#include "plan_links.h"

#include <mpi.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/log.h"
#include "../io/jsonio.h"
#include "../io/metrics_timing.h"
#include "../train/trainer.h"
#include "commands.h"

int fsdp_cli_link_check(const char *command, const fsdp_cli_link_flags *f, fsdp_err *err) {
    if (f->link_gbps < 0.0)
        return fsdp_usagef(err, "%s: --link-gbps %g is not a bandwidth (GB/s above 0)", command, f->link_gbps);
    if (f->intra_gbps <= 0.0)
        return fsdp_usagef(err, "%s: --intra-gbps %g is not a bandwidth (GB/s above 0)", command, f->intra_gbps);
    if (f->update_gbps <= 0.0)
        return fsdp_usagef(err, "%s: --update-gbps %g is not a bandwidth (GB/s above 0)", command, f->update_gbps);
    if (f->interference < 0.0 || f->gather_interference < 0.0)
        return fsdp_usagef(err, "%s: --interference %g or --gather-interference %g is below 0", command,
                           f->interference, f->gather_interference);
    if (f->compute_tflops < 0.0)
        return fsdp_usagef(err, "%s: --compute-tflops %g is below 0", command, f->compute_tflops);
    if (f->link_concurrency < 0.0 || f->link_concurrency > 1.0)
        return fsdp_usagef(err, "%s: --link-concurrency %g is outside [0, 1]", command, f->link_concurrency);
    int sources = (f->compute_from != NULL) + (f->calibrate != NULL) + (f->compute_tflops > 0.0);
    if (sources > 1)
        return fsdp_usagef(err, "%s: give one of --compute-from, --calibrate and --compute-tflops", command);
    struct stat st;
    if (f->calibrate && stat(f->calibrate, &st) == 0)
        return fsdp_usagef(err, "%s: --calibrate %s exists: it is where the calibration run writes its metrics (use "
                                "--compute-from %s to plan from it, or remove it)",
                           command, f->calibrate, f->calibrate);
    return 0;
}

/* The options of the run a metrics file recorded, on top of `o` (what the file does not say). */
static int options_of_run(const char *command, const fsdp_metrics_timing *t, const fsdp_train_options *o,
                          fsdp_train_options *r, fsdp_plan_place *place, const char *path, fsdp_err *err) {
    *r = *o;
    r->mbs = t->mbs, r->seq = t->seq, r->grad_accum = t->grad_accum, r->global_batch = 0, r->mbs_auto = 0;
    if (fsdp_strategy_parse(t->strategy, &r->strategy) || fsdp_dtype_parse(t->model_precision, &r->master_dtype))
        return fsdp_usagef(err, "%s: --compute-from %s: strategy '%s' or model precision '%s' unknown", command, path,
                           t->strategy, t->model_precision);
    r->compute_dtype = !strcmp(t->mixed_precision, "bf16") ? FSDP_BF16 : r->master_dtype;
    r->reduce_dtype = r->master_dtype, r->gather_dtype = r->compute_dtype;
    if (t->reduce_dtype[0] && fsdp_dtype_parse(t->reduce_dtype, &r->reduce_dtype))
        return fsdp_usagef(err, "%s: --compute-from %s: reduce dtype '%s' unknown", command, path, t->reduce_dtype);
    if (t->gather_dtype[0] && fsdp_dtype_parse(t->gather_dtype, &r->gather_dtype))
        return fsdp_usagef(err, "%s: --compute-from %s: gather dtype '%s' unknown", command, path, t->gather_dtype);
    r->accumulate = !strcmp(t->accumulate, "local")     ? FSDP_ACCUMULATE_LOCAL
                    : !strcmp(t->accumulate, "sharded") ? FSDP_ACCUMULATE_SHARDED
                                                        : FSDP_ACCUMULATE_AUTO;
    r->attn = fsdp_attn_of(t->attn);
    if (t->recompute[0]) fsdp_recompute_parse(t->recompute, &r->recompute);
    place->world = t->world_size;
    place->node_size = t->ranks_per_node > 0 && t->world_size % t->ranks_per_node == 0 ? t->ranks_per_node : t->world_size;
    return 0;
}

static int calibrate(const char *command, const char *path, const fsdp_model_config *cfg, const fsdp_train_options *o,
                     fsdp_err *err) {
    int ranks = 1;
    FSDP_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &ranks));
    if (ranks > 1)
        return fsdp_usagef(err, "%s: --calibrate trains on one rank: run it without mpirun", command);
    char mbs[16], seq[16];
    snprintf(mbs, sizeof mbs, "%d", o->mbs);
    snprintf(seq, sizeof seq, "%d", o->seq);
    const char *device = o->device ? o->device : "auto";
    char *argv[] = {"train", "--model", (char *)o->model, "--mbs", mbs, "--seq", seq, "--steps", "4", "--lr", "1e-5",
                    "--log-every", "100", "--metrics", (char *)path, "--device", (char *)device, "--model-precision",
                    (char *)fsdp_dtype_name(o->master_dtype), "--mixed-precision",
                    o->compute_dtype == FSDP_BF16 ? "bf16" : "no", "--attn", (char *)fsdp_attn_name(o->attn),
                    "--recompute", (char *)fsdp_recompute_name(o->recompute), "--synthetic-vocab",
                    cfg->vocab_size < 1000 ? "100" : "1000", NULL};
    int argc = (int)(sizeof argv / sizeof argv[0]) - 1;
    /* The run's lines go to stderr: stdout holds the plan alone (one JSON object with --json). */
    fflush(stdout);
    int saved = dup(STDOUT_FILENO);
    if (saved < 0 || dup2(STDERR_FILENO, STDOUT_FILENO) < 0) fsdp_fatal("dup2 of stdout for the calibration run failed");
    fsdp_log("calibration: training %s for 4 steps on this rank to measure its compute rate (metrics: %s)\n", cfg->name,
             path);
    int rc = fsdp_cmd_train(argc, argv);
    fflush(stdout);
    if (dup2(saved, STDOUT_FILENO) < 0) fsdp_fatal("dup2 restoring stdout after the calibration run failed");
    close(saved);
    if (rc) return fsdp_errf(err, "%s: the calibration run failed", command);
    return 0;
}

int fsdp_cli_link_rates(const char *command, const fsdp_cli_link_flags *f, const fsdp_model_config *cfg,
                        const fsdp_train_options *o, const fsdp_link *link, fsdp_rates *rates, char *source,
                        size_t cap, fsdp_err *err) {
    rates->update_gbps = f->update_gbps, rates->interference = f->interference;
    rates->gather_interference = f->gather_interference;
    if (f->compute_tflops > 0.0) {
        rates->tflops = f->compute_tflops;
        snprintf(source, cap, "--compute-tflops");
        return 0;
    }
    const char *path = f->compute_from;
    if (f->calibrate) {
        if (calibrate(command, f->calibrate, cfg, o, err)) return -1;
        path = f->calibrate;
    }
    if (!path) {
        rates->tflops = FSDP_ASSUMED_TFLOPS;
        snprintf(source, cap, "assumed: half an H100/H200's bf16 peak; measure it with --calibrate or --compute-from");
        return 0;
    }
    fsdp_metrics_timing t;
    if (fsdp_metrics_read_timing(path, &t, err)) return -1;
    fsdp_model_config run_cfg;
    fsdp_train_options r;
    fsdp_plan_place place = {o->device && !strcmp(o->device, "cpu") ? FSDP_DEVICE_CPU : FSDP_DEVICE_CUDA, 1, 1};
    if (fsdp_train_load_model(t.model, &run_cfg, err) || options_of_run(command, &t, o, &r, &place, path, err)) return -1;
    fsdp_link run_link = *link;
    run_link.nodes = t.nodes;
    if (t.nodes > 1 && link->inter_gbps <= 0.0)
        return fsdp_usagef(err, "%s: --compute-from %s ran on %d nodes: give the --link-gbps it ran over", command, path,
                           t.nodes);
    fsdp_rates measured = *rates;
    measured.tflops = FSDP_ASSUMED_TFLOPS;
    if (t.optimizer_ms > 0.0) { /* the update's rate, from the phases the run timed */
        fsdp_step_time at_default;
        fsdp_step_time_predict(&run_cfg, &r, &place, &run_link, &measured, &at_default);
        measured.update_gbps = rates->update_gbps * at_default.optimizer_ms / t.optimizer_ms;
    }
    measured.tflops = fsdp_step_time_rate_for(&run_cfg, &r, &place, &run_link, &measured, t.step_ms);
    *rates = measured;
    snprintf(source, cap, "measured by %s: %s, %s, %d rank%s, micro-batch %d x %d, %.1f ms a step", path, t.model,
             t.strategy, t.world_size, t.world_size > 1 ? "s" : "", t.mbs, t.grad_accum, t.step_ms);
    return 0;
}

static double gb(double bytes) { return bytes / 1e9; }

void fsdp_cli_link_print(const fsdp_link_table *t, const fsdp_plan_place *place, const fsdp_link *link,
                         const fsdp_rates *rates, const char *source, size_t budget) {
    printf("\nstep time: %d GPU%s on %d node%s", place->world, place->world > 1 ? "s" : "", link->nodes,
           link->nodes > 1 ? "s" : "");
    if (link->nodes > 1) printf(", %g GB/s per GPU between nodes", link->inter_gbps);
    if (link->nodes > 1 && link->inter_concurrency > 0.0)
        printf(" (a gather and a reduction at once: each at %.2f of its speed)", 1.0 / (2.0 - link->inter_concurrency));
    else if (link->nodes <= 1 && link->inter_gbps > 0.0) printf(" (--link-gbps unused: one node; --nodes K plans K)");
    printf(", %g GB/s inside a node | compute %.4g TFLOP/s (%s) | update %.4g GB/s | interference: reductions %.2f, "
           "gathers %.2f\n",
           link->intra_gbps, rates->tflops, source, rates->update_gbps, rates->interference, rates->gather_interference);
    for (int i = 0; i < t->n; i++) {
        const fsdp_link_row *r = &t->rows[i];
        if (!r->requested) continue;
        char name[160];
        fsdp_link_row_name(r, name, sizeof name);
        printf("  %s: %.1f ms a step = compute %.1f (update %.1f) + exposed communication %.1f; %.2f GB sent per GPU "
               "(%.1f ms at the link's speed alone) -> %.0f tokens/s/GPU\n",
               name, r->time.step_ms, r->time.compute_ms, r->time.optimizer_ms, r->time.exposed_ms, gb(r->time.bytes.total),
               r->time.comm_ms, r->time.tokens_per_s_per_gpu);
    }
    char b[32];
    if (budget) printf("\nconfigurations, those that fit in %s first, fastest first:\n", fsdp_bytes_text((double)budget, b));
    else printf("\nconfigurations, fastest first (memory not checked: no --gpu-mem):\n");
    printf("  %12s %9s %9s %9s %8s %7s %5s  %-s\n", "tokens/s/GPU", "step ms", "compute", "exposed", "GB/step", "GiB",
           "fits", "mbs x accum  configuration");
    for (int i = 0; i < t->n; i++) {
        const fsdp_link_row *r = &t->rows[i];
        char name[160], mb[32];
        fsdp_link_row_name(r, name, sizeof name);
        snprintf(mb, sizeof mb, "%d x %d", r->o.mbs, r->time.microbatches);
        printf("  %12.0f %9.1f %9.1f %9.1f %8.2f %7.2f %5s  %-12s %s%s%s\n", r->time.tokens_per_s_per_gpu, r->time.step_ms,
               r->time.compute_ms, r->time.exposed_ms, gb(r->time.bytes.total), fsdp_gib(r->mem.total),
               r->fits < 0 ? "?" : r->fits ? "yes" : "no", mb, name, r->requested ? "   <- as asked" : "",
               i == 0 && r->fits != 0 ? "   <- fastest" : "");
    }
}

static json_t *bytes_json(const fsdp_comm_bytes *c) {
    json_t *v = json_object();
    for (int k = 0; k < FSDP_COMM_KINDS; k++)
        json_object_set_new(v, fsdp_comm_kind_name((fsdp_comm_kind)k), json_integer((json_int_t)(c->bytes[k] + 0.5)));
    json_object_set_new(v, "total", json_integer((json_int_t)(c->total + 0.5)));
    return v;
}

json_t *fsdp_cli_link_json(const fsdp_link_table *t, const fsdp_link *link, const fsdp_rates *rates,
                           const char *source) {
    json_t *v = json_object(), *rows = json_array();
    json_object_set_new(v, "link", json_pack("{s:i, s:o, s:o, s:o}", "nodes", link->nodes, "inter_gbps",
                                             fsdp_json_number(link->inter_gbps), "intra_gbps",
                                             fsdp_json_number(link->intra_gbps), "inter_concurrency",
                                             fsdp_json_number(link->inter_concurrency)));
    json_object_set_new(v, "rates", json_pack("{s:o, s:o, s:o, s:o, s:s}", "compute_tflops",
                                              fsdp_json_number(rates->tflops), "update_gbps",
                                              fsdp_json_number(rates->update_gbps), "interference",
                                              fsdp_json_number(rates->interference), "gather_interference",
                                              fsdp_json_number(rates->gather_interference), "source", source));
    for (int i = 0; i < t->n; i++) {
        const fsdp_link_row *r = &t->rows[i];
        const fsdp_step_time *s = &r->time;
        char name[160];
        fsdp_link_row_name(r, name, sizeof name);
        json_t *row = json_pack(
            "{s:s, s:s, s:i, s:i, s:s, s:s, s:s, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:b}", "name", name,
            "strategy", fsdp_strategy_name(r->o.strategy), "mbs", r->o.mbs, "grad_accum", s->microbatches, "reduce_dtype",
            fsdp_dtype_name(r->o.reduce_dtype), "gather_dtype", fsdp_dtype_name(r->o.gather_dtype), "accumulate",
            fsdp_plan_accumulate_local(&r->o, 0) ? "local" : "sharded", "reshard_after_forward",
            r->o.reshard_after_forward > 0 ? json_integer(r->o.reshard_after_forward) : json_null(), "fits",
            r->fits < 0 ? json_null() : json_boolean(r->fits), "total_gib", fsdp_json_number(fsdp_gib(r->mem.total)),
            "tokens_per_s_per_gpu", fsdp_json_number(s->tokens_per_s_per_gpu), "step_ms", fsdp_json_number(s->step_ms),
            "compute_ms", fsdp_json_number(s->compute_ms), "optimizer_ms", fsdp_json_number(s->optimizer_ms),
            "exposed_ms", fsdp_json_number(s->exposed_ms), "comm_ms", fsdp_json_number(s->comm_ms), "comm_bytes",
            bytes_json(&s->bytes), "requested", r->requested);
        if (!row) fsdp_fatal("out of host memory building the plan's JSON");
        json_array_append_new(rows, row);
    }
    json_object_set_new(v, "configurations", rows);
    return v;
}
