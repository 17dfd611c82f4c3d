/* `fsdp report` end to end (report.h): collect, group, draw, write, then move into place. */
#include "report.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/log.h"
#include "experiments.h"
#include "plots.h"
#include "tables.h"

/* Creates `dir` and its missing parents. */
static int make_dirs(const char *dir, fsdp_err *err) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return fsdp_usagef(err, "report: --out %s: path too long", dir);
    for (char *p = path + 1;; p++) {
        char c = *p;
        if (c != '/' && c != '\0') continue;
        *p = '\0';
        struct stat st;
        if (mkdir(path, 0777) != 0 && (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)))
            return fsdp_errf(err, "report: cannot create %s: %s", path, strerror(errno));
        *p = c;
        if (!c) return 0;
    }
}

/* Removes a folder this command made (files and folders only). */
static void remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char path[4400];
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            struct stat st;
            if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode))
                remove_tree(path);
            else
                unlink(path);
        }
        closedir(d);
    }
    rmdir(dir);
}

static int move(const char *from_dir, const char *name, const char *to_dir, fsdp_err *err) {
    char from[4400], to[4400];
    snprintf(from, sizeof from, "%s/%s", from_dir, name);
    snprintf(to, sizeof to, "%s/%s", to_dir, name);
    if (rename(from, to) != 0) return fsdp_errf(err, "report: cannot move %s to %s: %s", from, to, strerror(errno));
    return 0;
}

static int write_markdown(const char *stage, const fsdp_report_content *c, fsdp_err *err) {
    char path[4400];
    snprintf(path, sizeof path, "%s/report.md", stage);
    FILE *fp = fopen(path, "w");
    if (!fp) return fsdp_errf(err, "report: cannot write %s: %s", path, strerror(errno));
    fsdp_report_write_markdown(fp, c);
    int bad = ferror(fp);
    if (fclose(fp) != 0 || bad) return fsdp_errf(err, "report: cannot write %s: %s", path, strerror(errno));
    return 0;
}

/* Draws every plot into the stage; returns how many PNGs, or -1. */
static int draw(const char *stage, const fsdp_report_content *c, fsdp_err *err) {
    int pngs = 0;
    for (int i = 0; i < c->num_exps; i++) {
        if (fsdp_plot_experiment(stage, &c->exps[i], c->runs, c->opt, err)) return -1;
        pngs += c->exps[i].kind == FSDP_EXP_SCALING ? 2 : 1;
    }
    for (int i = 0; i < c->num_losses; i++) {
        if (fsdp_plot_losses(stage, &c->losses[i], c->runs, err)) return -1;
        pngs++;
    }
    return pngs;
}

/* The stage's PNGs, then its gnuplot folder (replacing an older one), then report.md: a reader of
 * report.md never finds a plot missing. */
static int publish(const char *stage, const char *out, fsdp_err *err) {
    DIR *d = opendir(stage);
    if (!d) return fsdp_errf(err, "report: cannot read %s: %s", stage, strerror(errno));
    struct dirent *e;
    int rc = 0;
    while (!rc && (e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n > 4 && !strcmp(e->d_name + n - 4, ".png")) rc = move(stage, e->d_name, out, err);
    }
    closedir(d);
    if (rc) return -1;
    char staged[4400], old[4400], kept[4400];
    snprintf(staged, sizeof staged, "%s/gnuplot", stage);
    snprintf(old, sizeof old, "%s/gnuplot", out);
    snprintf(kept, sizeof kept, "%s/gnuplot.old", stage);
    struct stat st;
    if (stat(staged, &st) == 0) {
        if (stat(old, &st) == 0 && rename(old, kept) != 0)
            return fsdp_errf(err, "report: cannot replace %s: %s", old, strerror(errno));
        if (rename(staged, old) != 0) return fsdp_errf(err, "report: cannot move %s: %s", staged, strerror(errno));
    }
    return move(stage, "report.md", out, err);
}

int fsdp_report_write(const fsdp_report_options *o, fsdp_err *err) {
    if (o->plots && fsdp_plots_check_gnuplot(err)) return -1;
    fsdp_report_content c;
    memset(&c, 0, sizeof c);
    c.opt = o;
    fsdp_report_run *runs = NULL;
    if (fsdp_report_collect(o->dirs, o->num_dirs, &runs, &c.num_runs, err)) return -1;
    c.runs = runs;
    fsdp_experiment *exps = NULL;
    fsdp_loss_group *losses = NULL;
    c.num_exps = fsdp_report_experiments(runs, c.num_runs, &exps);
    c.exps = exps;
    c.num_losses = o->plots ? fsdp_report_loss_groups(runs, c.num_runs, &losses) : 0;
    c.losses = losses;

    char stage[4200] = "";
    int pngs = 0, rc = make_dirs(o->out_dir, err);
    if (!rc) {
        snprintf(stage, sizeof stage, "%s/.fsdp-report-XXXXXX", o->out_dir);
        if (!mkdtemp(stage)) {
            rc = fsdp_errf(err, "report: cannot create a staging folder in %s: %s", o->out_dir, strerror(errno));
            stage[0] = '\0';
        }
    }
    if (!rc && o->plots) {
        pngs = draw(stage, &c, err);
        rc = pngs < 0 ? -1 : 0;
    }
    if (!rc) rc = write_markdown(stage, &c, err);
    if (!rc) rc = publish(stage, o->out_dir, err);
    if (stage[0]) remove_tree(stage);
    if (!rc)
        fsdp_log("report: %d run%s, %d experiment%s -> %s/report.md and %d plot%s\n", c.num_runs,
                 c.num_runs == 1 ? "" : "s", c.num_exps, c.num_exps == 1 ? "" : "s", o->out_dir, pngs,
                 pngs == 1 ? "" : "s");
    fsdp_report_loss_groups_free(losses, c.num_losses);
    fsdp_report_experiments_free(exps, c.num_exps);
    fsdp_report_runs_free(runs, c.num_runs);
    return rc ? -1 : 0;
}
