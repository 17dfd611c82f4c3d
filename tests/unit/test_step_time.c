/* The step-time arithmetic of `fsdp plan --link-gbps` on cases computed by hand:
 *  - the timeline (src/train/timeline.c): overlap, interference, dependencies, stream order, a
 *    link shared by a gather and a reduction;
 *  - fsdp_step_time_predict on one rank (no communication): the step is the model FLOPs at the rate
 *    plus the update's bytes at its bandwidth, to the rounding;
 *  - on two ranks over a link so slow that communication is the whole step, the step is the bytes
 *    of the gathers and reductions at that bandwidth (the streams' transfers serialize on each
 *    stream) plus no more than the compute;
 *  - hpZ on two nodes of two ranks: the backward's gathers inside the node, at its bandwidth. */
#include <math.h>
#include <string.h>

#include "../../src/model/config.h"
#include "../../src/train/step_time.h"
#include "../../src/train/timeline.h"
#include "check.h"

static const double NO_INTERFERENCE[FSDP_TL_STREAMS] = {0.0, 0.0, 0.0};

static void timeline_cases(void) {
    /* Compute of 10 ms beside a 4 ms gather: a perfect overlap takes 10 ms. */
    fsdp_timeline t = {0};
    fsdp_timeline_add(&t, FSDP_TL_COMPUTE, 10.0);
    fsdp_timeline_add(&t, FSDP_TL_GATHER, 4.0);
    check_close("perfect overlap: 10 ms", fabs(fsdp_timeline_run(&t, NO_INTERFERENCE) - 10.0), 1e-9);
    /* With the gather's interference 1 both run at half speed while together: the gather ends at
     * 8 ms, the compute has done 4 of its 10 ms and ends 6 ms later, at 14. */
    double k1[FSDP_TL_STREAMS] = {0.0, 1.0, 0.0};
    check_close("interference 1: 14 ms", fabs(fsdp_timeline_run(&t, k1) - 14.0), 1e-9);
    check_close("  the gather ends at 8 ms", fabs(t.tasks[1].end - 8.0), 1e-9);
    /* Interference 0.5 of a reduction: together at 2/3 speed; the 4 ms reduction ends at 6 ms,
     * the compute then has 10 - 4 = 6 ms left: 12 ms. The gather's interference does not apply. */
    fsdp_timeline_free(&t);
    fsdp_timeline_add(&t, FSDP_TL_COMPUTE, 10.0);
    fsdp_timeline_add(&t, FSDP_TL_REDUCE, 4.0);
    double k2[FSDP_TL_STREAMS] = {0.0, 3.0, 0.5};
    check_close("reduction interference 0.5: 12 ms", fabs(fsdp_timeline_run(&t, k2) - 12.0), 1e-9);
    fsdp_timeline_free(&t);

    /* Dependencies: gather g0 (3 ms), compute c0 (5) after it, gather g1 (6) prefetched under c0,
     * compute c1 (2) after g1, reduction r1 (4) after c1: c0 runs 3-8, g1 3-9, c1 9-11, r1 11-15. */
    int g0 = fsdp_timeline_add(&t, FSDP_TL_GATHER, 3.0);
    int c0 = fsdp_timeline_add(&t, FSDP_TL_COMPUTE, 5.0);
    fsdp_timeline_after(&t, c0, g0);
    int g1 = fsdp_timeline_add(&t, FSDP_TL_GATHER, 6.0);
    int c1 = fsdp_timeline_add(&t, FSDP_TL_COMPUTE, 2.0);
    fsdp_timeline_after(&t, c1, g1);
    int r1 = fsdp_timeline_add(&t, FSDP_TL_REDUCE, 4.0);
    fsdp_timeline_after(&t, r1, c1);
    double end = fsdp_timeline_run(&t, NO_INTERFERENCE);
    check_close("chain: ends at 15 ms", fabs(end - 15.0), 1e-9);
    check_close("  c0 starts after its gather, at 3", fabs(t.tasks[c0].start - 3.0), 1e-9);
    check_close("  c1 waits for g1 (ends 9), not c0 (ends 8)", fabs(t.tasks[c1].start - 9.0), 1e-9);
    check_close("  r1 starts when c1 ends, at 11", fabs(t.tasks[r1].start - 11.0), 1e-9);
    /* The same with the gathers' interference 1: g0 alone 0-3; c0 and g1 together at half speed
     * from 3: c0 ends at 13 (5 ms of work), g1 then has 6 - 5 = 1 ms left alone: 14; c1 14-16,
     * r1 16-20. */
    double k3[FSDP_TL_STREAMS] = {0.0, 1.0, 0.0};
    check_close("chain with interference: ends at 20 ms", fabs(fsdp_timeline_run(&t, k3) - 20.0), 1e-9);
    fsdp_timeline_free(&t);

    /* A gather and a reduction of 4 ms each on one link share it: both end at 8 ms; on two links, at 4. */
    int g = fsdp_timeline_add(&t, FSDP_TL_GATHER, 4.0), r = fsdp_timeline_add(&t, FSDP_TL_REDUCE, 4.0);
    t.tasks[g].link = t.tasks[r].link = 1;
    check_close("one link shared: 8 ms", fabs(fsdp_timeline_run(&t, NO_INTERFERENCE) - 8.0), 1e-9);
    t.tasks[r].link = 2;
    check_close("two links: 4 ms", fabs(fsdp_timeline_run(&t, NO_INTERFERENCE) - 4.0), 1e-9);
    /* Link 1 of concurrency 0.5: together each at 1 / 1.5 of its speed, both end at 6 ms; of
     * concurrency 1 at 4 ms. A 2 ms reduction beside the 4 ms gather at 0.5: both at 2/3 until the
     * reduction ends at 3 ms (the gather has done 2), the gather alone 2 ms more: 5 ms. */
    t.tasks[r].link = 1;
    t.concurrency[1] = 0.5;
    check_close("concurrency 0.5: 6 ms", fabs(fsdp_timeline_run(&t, NO_INTERFERENCE) - 6.0), 1e-9);
    t.concurrency[1] = 1.0;
    check_close("concurrency 1: 4 ms", fabs(fsdp_timeline_run(&t, NO_INTERFERENCE) - 4.0), 1e-9);
    t.concurrency[1] = 0.5;
    t.tasks[r].ms = 2.0;
    check_close("concurrency 0.5, 4 and 2 ms: 5 ms", fabs(fsdp_timeline_run(&t, NO_INTERFERENCE) - 5.0), 1e-9);
    check_close("  the reduction ends at 3 ms", fabs(t.tasks[r].end - 3.0), 1e-9);
    t.concurrency[2] = 1.0; /* another link's concurrency changes nothing here */
    check_close("  link 2's concurrency does not apply to link 1", fabs(fsdp_timeline_run(&t, NO_INTERFERENCE) - 5.0),
                1e-9);
    fsdp_timeline_free(&t);
}

static fsdp_train_options options(int mbs, int seq) {
    fsdp_train_options o;
    memset(&o, 0, sizeof o);
    o.strategy = FSDP_FULL, o.mbs = mbs, o.seq = seq, o.grad_accum = 1, o.max_live = 2, o.prefetch = 1;
    o.master_dtype = o.compute_dtype = o.reduce_dtype = o.gather_dtype = FSDP_F32;
    o.attn = FSDP_ATTN_FLASH, o.embed_grads = FSDP_EMBED_GRADS_DENSE;
    return o;
}

static void one_rank(void) {
    fsdp_model_config cfg;
    CHECK(fsdp_model_preset("tiny-llama", &cfg) == 0);
    fsdp_train_options o = options(2, 16);
    fsdp_plan_place place = {FSDP_DEVICE_CPU, 1, 1};
    fsdp_link link = {1, 100.0, 100.0, 0.0};
    fsdp_rates rates = {0.002, 1.0, 0.7, 0.0}; /* 2 GFLOP/s, 1 GB/s */
    fsdp_step_time st;
    fsdp_step_time_predict(&cfg, &o, &place, &link, &rates, &st);
    /* By hand: each block 2 x its parameters x tokens plus the attention's 2 x hidden x seq per token
     * forward, twice that backward; the head 6 x hidden x vocab per token. */
    fsdp_layout l;
    fsdp_layout_build(&cfg, &l);
    double T = 2.0 * 16, C = cfg.hidden_size;
    double block = 2.0 * (double)l.units[fsdp_unit_block(&l, 0)].numel * T + 2.0 * C * 16 * T;
    double flops = cfg.num_layers * 3.0 * block + 6.0 * C * cfg.vocab_size * T;
    /* The update: 7 fp32 values per shard element (one rank: the whole unit padded to 64). */
    double elems = 0.0;
    for (int u = 0; u < l.num_units; u++) elems += (double)((l.units[u].numel + 63) / 64 * 64);
    double update_ms = elems * 28.0 / 1e6;
    double want = flops / (0.002 * 1e9) + update_ms;
    check_close("one rank: the step is its FLOPs and its update (relative error)", fabs(st.step_ms - want) / want, 1e-9);
    check_close("  the update", fabs(st.optimizer_ms - update_ms) / update_ms, 1e-9);
    check_that(st.bytes.total == 0.0 && st.exposed_ms < 1e-9, "  nothing sent, nothing exposed (%.3g bytes)",
               st.bytes.total);
    check_close("  tokens/s", fabs(st.tokens_per_s_per_gpu - T / (want / 1e3)) / st.tokens_per_s_per_gpu, 1e-9);
    CHECK(fabs(fsdp_step_time_microbatch_flops(&cfg, &o) - flops) <= 1e-9 * flops);
    /* The rate a measured step implies is the one that predicts it. */
    double r = fsdp_step_time_rate_for(&cfg, &o, &place, &link, &rates, st.step_ms * 2.0);
    fsdp_rates slower = rates;
    slower.tflops = r;
    fsdp_step_time s2;
    fsdp_step_time_predict(&cfg, &o, &place, &link, &slower, &s2);
    check_close("the rate for a step twice as long predicts it", fabs(s2.step_ms / (2.0 * st.step_ms) - 1.0), 1e-3);

    /* Two ranks, FULL, on a link of 1 MB/s (1000 bytes a ms; two nodes of one GPU): communication is
     * the whole step.
     * The gathers (forward and backward) run one after the other on their stream, as do the
     * reductions on theirs, so the step lies between the longer stream's bytes at that bandwidth and
     * both streams' bytes plus the compute. */
    fsdp_plan_place two = {FSDP_DEVICE_CPU, 2, 1};
    fsdp_link slow = {2, 0.001, 100.0, 0.0};
    fsdp_step_time s3;
    fsdp_step_time_predict(&cfg, &o, &two, &slow, &rates, &s3);
    double g = s3.bytes.bytes[FSDP_COMM_GATHER] / 1e3, red = s3.bytes.bytes[FSDP_COMM_REDUCE] / 1e3;
    double lo = g > red ? g : red, hi = g + red + s3.compute_ms;
    check_that(s3.step_ms >= lo * 0.999 && s3.step_ms <= hi * 1.001,
               "two ranks on 1 MB/s: step %.1f ms within [%.1f, %.1f] (gathers %.1f, reductions %.1f ms)", s3.step_ms, lo,
               hi, g, red);
    double sent_ms = (s3.bytes.total - s3.bytes.bytes[FSDP_COMM_OTHER]) / 1e3;
    check_close("  comm_ms is the bytes at the bandwidth", fabs(s3.comm_ms - sent_ms) / s3.comm_ms, 1e-6);

    /* Four ranks on two nodes of two, the same slow link between nodes and 100 GB/s inside: with hpZ
     * (the node's 2 ranks) the backward's gathers go inside the node, counted apart and timed at the
     * inner bandwidth, so fewer bytes cross nodes and the step is shorter than FULL's. */
    fsdp_plan_place four = {FSDP_DEVICE_CPU, 4, 2};
    fsdp_step_time full, hpz;
    fsdp_step_time_predict(&cfg, &o, &four, &slow, &rates, &full);
    fsdp_train_options oh = o;
    oh.reshard_after_forward = 2;
    fsdp_step_time_predict(&cfg, &oh, &four, &slow, &rates, &hpz);
    check_that(full.bytes.bytes[FSDP_COMM_GATHER_SECONDARY] == 0.0 && hpz.bytes.bytes[FSDP_COMM_GATHER_SECONDARY] > 0.0,
               "hpZ: secondary gathers only with it (%.0f bytes)", hpz.bytes.bytes[FSDP_COMM_GATHER_SECONDARY]);
    check_that(hpz.bytes.bytes[FSDP_COMM_GATHER] < full.bytes.bytes[FSDP_COMM_GATHER] &&
                   hpz.bytes.bytes[FSDP_COMM_REDUCE] == full.bytes.bytes[FSDP_COMM_REDUCE],
               "  fewer gathers across nodes (%.0f of FULL's %.0f bytes), the same reductions",
               hpz.bytes.bytes[FSDP_COMM_GATHER], full.bytes.bytes[FSDP_COMM_GATHER]);
    double inner = hpz.bytes.bytes[FSDP_COMM_GATHER_SECONDARY];
    double hpz_ms = (hpz.bytes.total - hpz.bytes.bytes[FSDP_COMM_OTHER] - inner) / 1e3 + inner / 1e8;
    check_close("  comm_ms: the secondary gathers at the node's bandwidth", fabs(hpz.comm_ms - hpz_ms) / hpz.comm_ms,
                1e-6);
    check_that(hpz.step_ms < full.step_ms, "  a shorter step than FULL's (%.1f < %.1f ms)", hpz.step_ms, full.step_ms);
    fsdp_layout_free(&l);
}

int main(void) {
    timeline_cases();
    one_rank();
    return check_summary("test_step_time");
}
