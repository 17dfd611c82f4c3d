/* gnuplot data files and scripts for the plots of plots.h. */
#include "plots.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../base/log.h"

#define BLUE "#4C72B0"
#define ORANGE "#DD8452"
#define GREEN "#55A868"
#define RED "#C44E52"

/* ---- running gnuplot ---- */

int fsdp_plots_check_gnuplot(fsdp_err *err) {
    const char *path = getenv("PATH");
    char buf[4096];
    for (const char *p = path ? path : ""; *p;) {
        const char *end = strchr(p, ':');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        snprintf(buf, sizeof buf, "%.*s/gnuplot", (int)len, len ? p : ".");
        if (access(buf, X_OK) == 0) return 0;
        p += len + (end != NULL);
    }
    return fsdp_errf(err, "report: gnuplot not found on PATH: the plots need it (Debian: apt-get install gnuplot-nox), "
                          "or pass --plots=no for the tables alone");
}

/* Runs `gnuplot NAME.gp` inside DIR (the script's paths are relative to it), its output in NAME.log. */
static int run_gnuplot(const char *dir, const char *name, fsdp_err *err) {
    char log_path[4200], script[300];
    snprintf(log_path, sizeof log_path, "%s/%s.log", dir, name);
    snprintf(script, sizeof script, "%s.gp", name);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return fsdp_errf(err, "report: fork for gnuplot failed: %s", strerror(errno));
    if (pid == 0) {
        int log = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644), in = open("/dev/null", O_RDONLY);
        if (log < 0 || in < 0 || chdir(dir) != 0) _exit(126);
        dup2(in, 0), dup2(log, 1), dup2(log, 2);
        execlp("gnuplot", "gnuplot", script, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return fsdp_errf(err, "report: waiting for gnuplot failed: %s", strerror(errno));
    /* gnuplot's first complaint, for the error or as a notice. */
    char first[512] = "";
    FILE *fp = fopen(log_path, "r");
    if (fp) {
        char line[512];
        while (fgets(line, sizeof line, fp))
            if (line[0] != '\n' && line[0] != ' ' && !first[0]) snprintf(first, sizeof first, "%s", line);
        fclose(fp);
        first[strcspn(first, "\n")] = '\0';
    }
    unlink(log_path);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
        return fsdp_errf(err, "report: gnuplot could not be started (Debian: apt-get install gnuplot-nox)");
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return fsdp_errf(err, "report: gnuplot failed on %s/%s (status %d): %s", dir, script, status,
                         first[0] ? first : "no message");
    if (first[0]) fsdp_warn("gnuplot on %s: %s", script, first);
    return 0;
}

/* ---- writing scripts ---- */

typedef struct {
    FILE *gp, *dat;
    char dir[4200], name[256];
    /* What a rank ran on, in the labels: "GPU"/"GPUs", or "CPU rank"/"CPU ranks" for an experiment
     * of CPU runs only (the report's tables say the same). */
    const char *one, *many, *hours_title;
} plot_files;

static int open_plot(plot_files *f, const char *stage, const char *name, fsdp_err *err) {
    memset(f, 0, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "%s/gnuplot", stage);
    snprintf(f->name, sizeof f->name, "%s", name);
    if (mkdir(f->dir, 0777) != 0 && errno != EEXIST)
        return fsdp_errf(err, "report: cannot create %s: %s", f->dir, strerror(errno));
    char path[4600];
    snprintf(path, sizeof path, "%s/%s.gp", f->dir, name);
    f->gp = fopen(path, "w");
    snprintf(path, sizeof path, "%s/%s.dat", f->dir, name);
    f->dat = fopen(path, "w");
    if (!f->gp || !f->dat) {
        if (f->gp) fclose(f->gp);
        if (f->dat) fclose(f->dat);
        return fsdp_errf(err, "report: cannot write %s: %s", path, strerror(errno));
    }
    return 0;
}

static int close_and_draw(plot_files *f, fsdp_err *err) {
    int bad = ferror(f->gp) || ferror(f->dat);
    bad |= fclose(f->gp) != 0;
    bad |= fclose(f->dat) != 0;
    if (bad) return fsdp_errf(err, "report: cannot write the gnuplot files of %s in %s", f->name, f->dir);
    return run_gnuplot(f->dir, f->name, err);
}

/* A double-quoted gnuplot string (noenhanced: only backslash and quote need escaping). */
static void gp_quoted(FILE *fp, const char *s) {
    fputc('"', fp);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fputc('\\', fp);
        fputc(*s, fp);
    }
    fputc('"', fp);
}

static void preamble(FILE *gp, const char *png, int width, int height) {
    fprintf(gp, "set terminal pngcairo size %d,%d font \"DejaVu Sans,11\" noenhanced\n", width, height);
    fprintf(gp, "set output \"../%s.png\"\n", png);
    fputs("set datafile separator \"\\t\"\nset grid ytics lc rgb \"#d0d0d0\"\nset border 3\nset tics nomirror\n"
          "set style fill solid 0.85 border rgb \"#404040\"\nset boxwidth 0.65\n",
          gp);
}

static void set_title(FILE *gp, const char *what, const char *text) {
    fprintf(gp, "set %s ", what);
    gp_quoted(gp, text);
    fputc('\n', gp);
}

static double max_of(const double *v, int n) {
    double m = 0;
    for (int i = 0; i < n; i++)
        if (v[i] > m) m = v[i];
    return m > 0 ? m : 1;
}

static const fsdp_metrics_summary *S(const fsdp_report_run *runs, const fsdp_experiment *e, int i) {
    return &runs[e->rows[i]].m.summary;
}

/* ---- the experiments ---- */

static void multiplot(FILE *gp, int rows, int cols, const char *title) {
    fprintf(gp, "set multiplot layout %d,%d title ", rows, cols);
    gp_quoted(gp, title);
    fputs(" font \",13\"\n", gp);
}

/* Two bar panels over the rows of NAME.dat (columns: x, label, tokens/s/GPU, its note, GiB, its note):
 * throughput and memory, each bar annotated. */
static void bar_panels(FILE *gp, const char *one, const char *name, int n, double tps_max, double gib_max,
                       const char *tps_title, const char *tps_note, const char *gib_title, const char *gib_note) {
    fprintf(gp, "set xrange [0.4:%d.6]\nset xtics rotate by -30 left font \",10\"\nset bmargin 7\n", n);
    set_title(gp, "title", tps_title);
    fprintf(gp, "set ylabel \"tokens/s per %s\"\nset format y \"%%.1s%%c\"\nset yrange [0:%.6g]\n", one, tps_max * 1.2);
    fprintf(gp, "plot \"%s.dat\" using 1:3:xtic(2) with boxes lc rgb \"%s\" notitle, \\\n"
                "     \"\" using 1:3:(%s) with labels offset 0,0.9 font \",10\" notitle\n",
            name, BLUE, tps_note);
    set_title(gp, "title", gib_title);
    fprintf(gp, "set ylabel \"max reserved GiB per %s\"\nset format y \"%%g\"\nset yrange [0:%.6g]\n", one,
            gib_max * 1.2);
    fprintf(gp, "plot \"%s.dat\" using 1:5:xtic(2) with boxes lc rgb \"%s\" notitle, \\\n"
                "     \"\" using 1:5:(%s) with labels offset 0,0.9 font \",10\" notitle\n",
            name, ORANGE, gib_note);
    fputs("unset multiplot\n", gp);
}

static void plural_gpus(const plot_files *f, char *buf, size_t cap, int n) {
    snprintf(buf, cap, "%d %s", n, n > 1 ? f->many : f->one);
}

static void plot_ladder(plot_files *f, const fsdp_experiment *e, const fsdp_report_run *runs) {
    int n = e->num_rows;
    double *tps = fsdp_xmalloc((size_t)n * 2 * sizeof *tps, "plot values"), *gib = tps + n;
    fputs("# rung\tlabel\ttokens/s/GPU\tspeed-up over rung 1\tmax reserved GiB\tmicro-batch x accumulation\n", f->dat);
    for (int i = 0; i < n; i++) {
        const fsdp_metrics_summary *s = S(runs, e, i);
        tps[i] = s->tokens_per_s_per_gpu, gib[i] = s->max_reserved_gib;
        fprintf(f->dat, "%d\t%d: %s / %s / %s\t%.10g\t%.10g\t%.10g\t%d\n", i + 1, i + 1, s->model_precision,
                s->mixed_precision, s->attn, tps[i], tps[0] > 0 ? tps[i] / tps[0] : 0.0, gib[i], s->mbs * s->grad_accum);
    }
    const fsdp_metrics_summary *s0 = S(runs, e, 0);
    char title[1024], gpus[32];
    plural_gpus(f, gpus, sizeof gpus, s0->world_size);
    snprintf(title, sizeof title, "Ladder: %s on %s, %s, sequence %d  (rungs: model precision / mixed precision / "
             "attention)", runs[e->rows[0]].model_name, gpus, s0->strategy, s0->seq);
    preamble(f->gp, f->name, 1400, 640);
    multiplot(f->gp, 1, 2, title);
    char memory[96];
    snprintf(memory, sizeof memory, "Memory per rung (label: micro-batch per %s)", f->one);
    bar_panels(f->gp, f->one, f->name, n, max_of(tps, n), max_of(gib, n),
               "Throughput per rung (label: speed-up over rung 1)", "sprintf(\"%.2fx\", $4)", memory,
               "sprintf(\"MBS %d\", $6)");
    free(tps);
}

static void plot_strategies(plot_files *f, const fsdp_experiment *e, const fsdp_report_run *runs) {
    int n = e->num_rows;
    double *tps = fsdp_xmalloc((size_t)n * 2 * sizeof *tps, "plot values"), *gib = tps + n;
    fputs("# row\tstrategy\ttokens/s/GPU\trelative to the first row\tmax reserved GiB\ttotal tokens/s\n", f->dat);
    for (int i = 0; i < n; i++) {
        const fsdp_metrics_summary *s = S(runs, e, i);
        tps[i] = s->tokens_per_s_per_gpu, gib[i] = s->max_reserved_gib;
        fprintf(f->dat, "%d\t%s\t%.10g\t%.10g\t%.10g\t%.10g\n", i + 1, s->strategy, tps[i],
                tps[0] > 0 ? tps[i] / tps[0] : 0.0, gib[i], tps[i] * s->world_size);
    }
    const fsdp_metrics_summary *s0 = S(runs, e, 0);
    char title[1024], gpus[32], rel[128];
    plural_gpus(f, gpus, sizeof gpus, s0->world_size);
    snprintf(title, sizeof title, "Sharding strategies: %s on %s (%d node%s), MBS %d, sequence %d, %s / %s / %s",
             runs[e->rows[0]].model_name, gpus, s0->nodes, s0->nodes > 1 ? "s" : "", s0->mbs, s0->seq,
             s0->model_precision, s0->mixed_precision, s0->attn);
    snprintf(rel, sizeof rel, "Throughput per strategy (label: relative to %s)", s0->strategy);
    preamble(f->gp, f->name, 1300, 600);
    multiplot(f->gp, 1, 2, title);
    bar_panels(f->gp, f->one, f->name, n, max_of(tps, n), max_of(gib, n), rel, "sprintf(\"%.2fx\", $4)",
               "Memory per strategy (label: GiB)", "sprintf(\"%.3g\", $5)");
    free(tps);
}

static void gpu_xtics(FILE *gp, const char *many, const fsdp_experiment *e, const fsdp_report_run *runs) {
    int lo = S(runs, e, 0)->world_size, hi = S(runs, e, e->num_rows - 1)->world_size;
    fprintf(gp, "set logscale x 2\nset xrange [%.6g:%.6g]\nset xtics (", lo / 1.5, hi * 1.5);
    int last = -1;
    for (int i = 0; i < e->num_rows; i++) {
        int w = S(runs, e, i)->world_size;
        if (w != last) fprintf(gp, "%s\"%d\" %d", last < 0 ? "" : ", ", w, w);
        last = w;
    }
    fprintf(gp, ")\nset xlabel \"%s\"\n", many);
}

static void plot_scaling(plot_files *f, const fsdp_experiment *e, const fsdp_report_run *runs) {
    int n = e->num_rows;
    const fsdp_metrics_summary *s0 = S(runs, e, 0);
    double base = s0->tokens_per_s_per_gpu, top_total = 0, top_gpu = 0;
    fputs("# GPUs\tnodes\ttokens/s/GPU\ttotal tokens/s\tspeed-up\tefficiency %\tideal total tokens/s\n", f->dat);
    for (int i = 0; i < n; i++) {
        const fsdp_metrics_summary *s = S(runs, e, i);
        double total = s->tokens_per_s_per_gpu * s->world_size, ideal = base * s->world_size;
        double speedup = base > 0 ? total / (base * s0->world_size) : 0.0;
        double eff = base > 0 ? 100.0 * s->tokens_per_s_per_gpu / base : 0.0;
        if (total > top_total) top_total = total;
        if (ideal > top_total) top_total = ideal;
        if (s->tokens_per_s_per_gpu > top_gpu) top_gpu = s->tokens_per_s_per_gpu;
        fprintf(f->dat, "%d\t%d\t%.10g\t%.10g\t%.10g\t%.10g\t%.10g\n", s->world_size, s->nodes, s->tokens_per_s_per_gpu,
                total, speedup, eff, ideal);
    }
    char title[1024];
    snprintf(title, sizeof title, "Scaling: %s, %s, MBS %d per %s, sequence %d, %s / %s / %s",
             runs[e->rows[0]].model_name, s0->strategy, s0->mbs, f->one, s0->seq, s0->model_precision,
             s0->mixed_precision, s0->attn);
    preamble(f->gp, f->name, 1650, 560);
    multiplot(f->gp, 1, 3, title);
    gpu_xtics(f->gp, f->many, e, runs);
    fprintf(f->gp, "set key top left\nset format y \"%%.1s%%c\"\nset title \"Total throughput\"\n"
                   "set ylabel \"tokens/s (all %s)\"\nset yrange [0:%.6g]\n", f->many, top_total * 1.15);
    fprintf(f->gp, "plot \"%s.dat\" using 1:7 with lines dt 2 lw 2 lc rgb \"#808080\" title \"ideal (linear)\", \\\n"
                   "     \"\" using 1:4 with linespoints lw 2 pt 7 ps 1.3 lc rgb \"%s\" title \"measured\", \\\n"
                   "     \"\" using 1:4:(sprintf(\"%%.2fx\", $5)) with labels offset 0,1.2 font \",10\" notitle\n",
            f->name, BLUE);
    fprintf(f->gp, "set title \"Throughput per %s\"\nset ylabel \"tokens/s per %s\"\nset yrange [0:%.6g]\n", f->one,
            f->one, top_gpu * 1.2);
    fprintf(f->gp, "plot \"%s.dat\" using 1:3 with linespoints lw 2 pt 7 ps 1.3 lc rgb \"%s\" notitle\n", f->name,
            GREEN);
    fprintf(f->gp, "set title \"Parallel efficiency (per-%s throughput over the first point's)\"\n"
                   "set ylabel \"efficiency (%%)\"\nset format y \"%%g\"\nset yrange [0:115]\n", f->one);
    fprintf(f->gp, "plot \"%s.dat\" using 1:6 with linespoints lw 2 pt 7 ps 1.3 lc rgb \"%s\" notitle, \\\n"
                   "     \"\" using 1:6:(sprintf(\"%%.1f%%%%\", $6)) with labels offset 0,1.2 font \",10\" notitle\n",
            f->name, RED);
    fputs("unset multiplot\n", f->gp);
}

static void plot_cost(plot_files *f, const fsdp_experiment *e, const fsdp_report_run *runs,
                      const fsdp_report_options *o) {
    int priced = o->gpu_hour_price > 0;
    fputs("# GPUs\tGPU-hours per 1e9 tokens\tcost per 1e9 tokens\thours for 1e9 tokens on these GPUs\n", f->dat);
    double top = 0;
    for (int i = 0; i < e->num_rows; i++) {
        const fsdp_report_run *r = &runs[e->rows[i]];
        double gh = fsdp_report_gpu_hours_per_billion(r), cost = gh * o->gpu_hour_price;
        double y = priced ? cost : gh;
        if (y > top) top = y;
        fprintf(f->dat, "%d\t%.10g\t%.10g\t%.10g\n", r->m.summary.world_size, gh, cost,
                gh / r->m.summary.world_size);
    }
    char title[1024], ylabel[256];
    snprintf(title, sizeof title, "Cost of 1e9 tokens: %s, %s, MBS %d per %s%s%s%s", runs[e->rows[0]].model_name,
             S(runs, e, 0)->strategy, S(runs, e, 0)->mbs, f->one, priced ? "" : "  (no --gpu-hour-price: ",
             priced ? "" : f->one, priced ? "" : "-hours)");
    if (priced)
        snprintf(ylabel, sizeof ylabel, "cost per 1e9 tokens (%s, at %g %s per %s-hour)", o->currency,
                 o->gpu_hour_price, o->currency, f->one);
    else
        snprintf(ylabel, sizeof ylabel, "%s-hours per 1e9 tokens", f->one);
    preamble(f->gp, f->name, 1000, 600);
    set_title(f->gp, "title", title);
    gpu_xtics(f->gp, f->many, e, runs);
    set_title(f->gp, "ylabel", ylabel);
    double top_hours = 0;
    for (int i = 0; i < e->num_rows; i++) {
        const fsdp_report_run *r = &runs[e->rows[i]];
        double h = fsdp_report_gpu_hours_per_billion(r) / r->m.summary.world_size;
        if (h > top_hours) top_hours = h;
    }
    fprintf(f->gp, "set yrange [0:%.6g]\nset y2label \"hours to train 1e9 tokens on these %s\"\n"
                   "set y2range [0:%.6g]\nset y2tics\nset format y2 \"%%g\"\nset key outside top center horizontal\n",
            (top > 0 ? top : 1) * 1.25, f->many, (top_hours > 0 ? top_hours : 1) * 1.25);
    fprintf(f->gp, "plot \"%s.dat\" using 1:%d with linespoints lw 2 pt 7 ps 1.3 lc rgb \"%s\" title %s, \\\n"
                   "     \"\" using 1:%d:(sprintf(\"%%.3g\", $%d)) with labels offset 0,1.2 font \",10\" notitle, \\\n"
                   "     \"\" using 1:4 axes x1y2 with linespoints dt 2 lw 2 pt 5 lc rgb \"%s\" "
                   "title \"wall-clock hours (right axis)\"\n",
            f->name, priced ? 3 : 2, ORANGE, priced ? "\"cost (left axis)\"" : f->hours_title, priced ? 3 : 2,
            priced ? 3 : 2, BLUE);
}

static void set_units(plot_files *f, const fsdp_experiment *e, const fsdp_report_run *runs) {
    int cpu = 1;
    for (int i = 0; i < e->num_rows; i++) cpu &= !strncasecmp(S(runs, e, i)->device, "cpu", 3);
    f->one = cpu ? "CPU rank" : "GPU", f->many = cpu ? "CPU ranks" : "GPUs";
    f->hours_title = cpu ? "\"CPU rank-hours (left axis)\"" : "\"GPU-hours (left axis)\"";
}

int fsdp_plot_experiment(const char *stage, const fsdp_experiment *e, const fsdp_report_run *runs,
                         const fsdp_report_options *o, fsdp_err *err) {
    plot_files f;
    if (open_plot(&f, stage, e->slug, err)) return -1;
    set_units(&f, e, runs);
    if (e->kind == FSDP_EXP_LADDER)
        plot_ladder(&f, e, runs);
    else if (e->kind == FSDP_EXP_STRATEGIES)
        plot_strategies(&f, e, runs);
    else
        plot_scaling(&f, e, runs);
    if (close_and_draw(&f, err)) return -1;
    if (e->kind != FSDP_EXP_SCALING) return 0;
    char name[300];
    snprintf(name, sizeof name, "%s-cost", e->slug);
    if (open_plot(&f, stage, name, err)) return -1;
    set_units(&f, e, runs);
    plot_cost(&f, e, runs, o);
    return close_and_draw(&f, err);
}

/* ---- loss curves ---- */

int fsdp_plot_losses(const char *stage, const fsdp_loss_group *g, const fsdp_report_run *runs, fsdp_err *err) {
    plot_files f;
    if (open_plot(&f, stage, g->slug, err)) return -1;
    /* One data block per curve (gnuplot's `index`): a run's training loss, then its validation loss. */
    int block = 0;
    fputs("# blocks separated by two blank lines: step, loss\n", f.dat);
    preamble(f.gp, g->slug, 1100, 650);
    char title[1200];
    snprintf(title, sizeof title, "Loss per step: %s", g->group);
    set_title(f.gp, "title", title);
    int last_step = 1;
    for (int k = 0; k < g->num_rows; k++) {
        const fsdp_metrics_run *m = &runs[g->rows[k]].m;
        if (m->num_loss && m->loss[m->num_loss - 1].step > last_step) last_step = m->loss[m->num_loss - 1].step;
        if (m->num_eval && m->eval[m->num_eval - 1].step > last_step) last_step = m->eval[m->num_eval - 1].step;
    }
    fputs("set xlabel \"optimizer step\"\nset ylabel \"loss (cross-entropy)\"\nset key outside right top\n"
          "set format y \"%g\"\nset format x \"%g\"\n",
          f.gp);
    if (last_step <= 12) fputs("set xtics 1\n", f.gp);
    fputs("plot ", f.gp);
    for (int k = 0; k < g->num_rows; k++) {
        const fsdp_report_run *r = &runs[g->rows[k]];
        for (int curve = 0; curve < 2; curve++) {
            const fsdp_metrics_point *p = curve ? r->m.eval : r->m.loss;
            int np = curve ? r->m.num_eval : r->m.num_loss;
            if (np == 0) continue;
            for (int i = 0; i < np; i++) fprintf(f.dat, "%d\t%.10g\n", p[i].step, p[i].value);
            fputs("\n\n", f.dat);
            char label[4200];
            snprintf(label, sizeof label, "%s%s", r->short_name, curve ? " (validation)" : "");
            fprintf(f.gp, "%s\"%s.dat\" index %d using 1:2 with %s lw 2 lc %d title ", block ? ", \\\n     " : "",
                    g->slug, block, curve ? "linespoints dt 2 pt 7" : (np > 1 ? "lines" : "points pt 7"), k + 1);
            gp_quoted(f.gp, label);
            block++;
        }
    }
    fputc('\n', f.gp);
    return close_and_draw(&f, err);
}
