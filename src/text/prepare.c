/* The prepare pipeline of prepare.h: read a group, tokenize it on every thread, write it in order. */
#define _DEFAULT_SOURCE /* realpath */
#include "prepare.h"

#include <errno.h>
#include <malloc.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../base/output_paths.h"
#include "../base/rng.h"
#include "../io/special_tokens.h"
#include "../io/tokenizer_config.h"
#include "../io/tokens.h"
#include "tokenizer.h"

enum { STREAM_VALIDATION = 0x7a11 };

/* --max-memory per byte of text in a group: tokenizing takes up to 42 bytes per byte of the
 * documents in flight, everything counted (the text read, its copy in the group, the normalized
 * text, pieces, BPE symbols and merge heap, the ids): the most peak RSS grew per byte of a 4 MB
 * document among English, CJK, emoji, digits, runs of spaces, tabs, newlines, dots and one letter,
 * with Llama 2's, Llama 3's and GPT-2's tokenizers (Llama 2's BPE takes a whole document as one word:
 * runs of "  x" cost the most). 64 leaves room for what was not measured. */
enum { MEMORY_PER_TEXT_BYTE = 64 };

/* The streaming token writer's temporaries beside each output (io/tokens_write.c). */
static const char *const WRITER_TEMPORARIES[] = {"", ".tmp", ".tmp-documents", ".tmp-mask"};

/* The Stanford Alpaca prompt, with and without an input (LitGPT's Alpaca prompt style). */
static const char ALPACA_WITH_INPUT[] =
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n### Instruction:\n";
static const char ALPACA_NO_INPUT[] =
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n";

void fsdp_prepare_val_path(const char *out, char *buf, size_t cap) {
    const char *slash = strrchr(out, '/'), *dot = strrchr(out, '.');
    if (dot && (!slash || dot > slash + 1))
        snprintf(buf, cap, "%.*s.val%s", (int)(dot - out), out, dot);
    else
        snprintf(buf, cap, "%s.val", out);
}

/* One document of a group: its text (the prompt, for alpaca) and response in the group's arena. */
typedef struct {
    const char *text, *response;
    size_t len, response_len;
    int validation;
    int input;  /* where it comes from, for messages */
    long line;
    /* filled by the tokenizing thread */
    int thread;
    size_t offset, count, prompt_count;
    int failed;
} doc;

typedef struct {
    const fsdp_prepare_options *o;
    fsdp_tokenizer *tok;
    int alpaca;
    uint32_t eos;
    fsdp_tokenizer_state **states;
    fsdp_ids *outputs; /* per thread */
    size_t *largest;   /* per thread: the largest document it tokenized in the group, in bytes */
    fsdp_err *errors;  /* per document of the group */
    doc *docs;
    size_t num_docs, cap_docs;
    fsdp_arena arena;
    size_t group_bytes;
    size_t budget;          /* bytes of text a group may hold (and one document at most) */
    uint64_t next_document; /* number of the next document over all inputs */
    fsdp_tokens_writer *writers[2];
    fsdp_buf mask;
    /* progress */
    uint64_t total_bytes, done_bytes;
    double start, last_print;
} run;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static char *copy(run *r, const char *s, size_t n) {
    char *t = fsdp_arena_alloc(&r->arena, n + 1);
    memcpy(t, s, n);
    t[n] = 0;
    return t;
}

/* The bytes of text add_document keeps for d. */
static size_t document_bytes(const run *r, const fsdp_document *d) {
    if (!r->alpaca) return d->len;
    int has_input = d->input_len > 0;
    return strlen(has_input ? ALPACA_WITH_INPUT : ALPACA_NO_INPUT) + d->len + (has_input ? 13 + d->input_len : 0) + 16 +
           d->output_len;
}

/* Adds a document read from input `input` to the group. */
static void add_document(run *r, const fsdp_document *d, int input) {
    if (r->num_docs == r->cap_docs) {
        r->cap_docs = r->cap_docs ? 2 * r->cap_docs : 1024;
        r->docs = realloc(r->docs, r->cap_docs * sizeof *r->docs);
        if (!r->docs) fsdp_fatal("out of host memory (prepare's document list)");
    }
    doc *x = &r->docs[r->num_docs++];
    memset(x, 0, sizeof *x);
    x->input = input, x->line = d->line;
    if (r->alpaca) {
        int has_input = d->input_len > 0;
        const char *head = has_input ? ALPACA_WITH_INPUT : ALPACA_NO_INPUT;
        size_t n = strlen(head) + d->len + (has_input ? 13 + d->input_len : 0) + 16;
        char *p = fsdp_arena_alloc(&r->arena, n + 1), *o = p;
        memcpy(o, head, strlen(head)), o += strlen(head);
        memcpy(o, d->text, d->len), o += d->len;
        if (has_input) {
            memcpy(o, "\n\n### Input:\n", 13), o += 13;
            memcpy(o, d->input, d->input_len), o += d->input_len;
        }
        memcpy(o, "\n\n### Response:\n", 16), o += 16;
        x->text = p, x->len = (size_t)(o - p);
        x->response = copy(r, d->output, d->output_len), x->response_len = d->output_len;
    } else {
        x->text = copy(r, d->text, d->len), x->len = d->len;
    }
    r->group_bytes += x->len + x->response_len;
    x->validation = r->o->val_fraction > 0 &&
                    fsdp_rand_uniform(r->o->seed, STREAM_VALIDATION, r->next_document) < r->o->val_fraction;
    r->next_document++;
}

static void tokenize_one(run *r, size_t i, int thread) {
    doc *x = &r->docs[i];
    fsdp_ids *out = &r->outputs[thread];
    fsdp_tokenizer_state *s = r->states[thread];
    x->thread = thread, x->offset = out->n;
    if (x->len + x->response_len > r->largest[thread]) r->largest[thread] = x->len + x->response_len;
    int add = r->o->add_special_tokens;
    if (fsdp_tokenizer_encode(r->tok, s, x->text, x->len, add, out, &r->errors[i])) {
        x->failed = 1;
        return;
    }
    x->prompt_count = out->n - x->offset;
    if (r->alpaca) {
        if (fsdp_tokenizer_encode(r->tok, s, x->response, x->response_len, 0, out, &r->errors[i])) {
            x->failed = 1;
            return;
        }
        fsdp_ids_push(out, r->eos);
    }
    x->count = out->n - x->offset;
}

static void progress(run *r, uint64_t file_bytes, int final) {
    double t = now();
    if (!r->o->progress) return;
    int tty = isatty(2);
    if (!final && t - r->last_print < (tty ? 0.5 : 10.0)) return;
    r->last_print = t;
    double done = (double)(r->done_bytes + file_bytes), rate = done / (t - r->start + 1e-9);
    double left = r->total_bytes > done ? ((double)r->total_bytes - done) / (rate > 0 ? rate : 1) : 0;
    fprintf(stderr, "%sprepare: %.1f of %.1f MB (%.0f%%), %.2f MB/s, %llu documents, ETA %dm%02ds%s", tty ? "\r" : "",
            done / 1e6, (double)r->total_bytes / 1e6, r->total_bytes ? 100.0 * done / (double)r->total_bytes : 100.0,
            rate / 1e6, (unsigned long long)r->next_document, (int)(left / 60), (int)left % 60,
            tty && !final ? "   " : "\n");
    fflush(stderr);
}

/* A thread's tokenizer state and token buffer keep the size of the largest document it tokenized;
 * left alone, every thread would in time hold a large document's worth and the bound would grow
 * with the thread count. After a group, a thread's working memory is freed when it tokenized a
 * document above a quarter of its share of the group (its BPE cache goes with it), and its token
 * buffer when it outgrew a token per byte of its share: what the threads keep between groups stays
 * within 42/4 + 4 bytes per byte of a group, beside the 42 of the group being tokenized. (Freeing
 * the token buffers after every group cost prepare a tenth of its speed on English text.) */
static void shrink_threads(run *r) {
    int threads = r->o->threads;
    size_t share = r->budget / (size_t)threads;
    for (int t = 0; t < threads; t++) {
        if (r->largest[t] > share / 4) {
            fsdp_tokenizer_state_free(r->states[t]);
            r->states[t] = fsdp_tokenizer_state_new(r->tok);
        }
        if (r->outputs[t].cap > share) fsdp_ids_free(&r->outputs[t]);
    }
}

/* Tokenizes the group on every thread and writes it in order; empties the group. */
static int flush_group(run *r, fsdp_prepare_stats *st, fsdp_err *err) {
    int threads = r->o->threads;
    for (int t = 0; t < threads; t++) r->outputs[t].n = 0, r->largest[t] = 0;
    r->errors = realloc(r->errors, (r->num_docs + 1) * sizeof *r->errors);
    if (!r->errors) fsdp_fatal("out of host memory (prepare)");
    memset(r->errors, 0, (r->num_docs + 1) * sizeof *r->errors);
    long n = (long)r->num_docs;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (long i = 0; i < n; i++) tokenize_one(r, (size_t)i, omp_get_thread_num());
    for (size_t i = 0; i < r->num_docs; i++) {
        doc *x = &r->docs[i];
        if (x->failed) return fsdp_errf(err, "%s: line %ld: %s", r->o->inputs[x->input], x->line, r->errors[i].msg);
        if (!x->count) continue; /* a text of no tokens (possible with --no-special) */
        const uint32_t *ids = r->outputs[x->thread].p + x->offset;
        const uint8_t *mask = NULL;
        if (r->alpaca) {
            r->mask.n = 0;
            fsdp_buf_reserve(&r->mask, x->count + 1);
            memset(r->mask.p, 0, x->prompt_count);
            memset(r->mask.p + x->prompt_count, 1, x->count - x->prompt_count);
            mask = (const uint8_t *)r->mask.p;
        }
        int v = x->validation;
        if (fsdp_tokens_writer_add(r->writers[v], ids, mask, x->count, err)) return -1;
        st->documents[v]++;
        st->tokens[v] += x->count;
        if (st->model_max_length && x->count > st->model_max_length) st->longer++;
        st->counted[v] += r->alpaca ? x->count - x->prompt_count : x->count;
    }
    r->num_docs = 0;
    r->group_bytes = 0;
    fsdp_arena_reset(&r->arena);
    shrink_threads(r);
    return 0;
}

static int eos_of(run *r, fsdp_err *err) {
    static const char *const candidates[] = {"</s>", "<|end_of_text|>", "<|endoftext|>"};
    const char *want = r->o->eos_token;
    /* tokenizer_config.json's eos_token is transformers' tokenizer.eos_token */
    if (!want && fsdp_tokenizer_special_id(r->tok, FSDP_SPECIAL_EOS, &r->eos)) return 0;
    for (int i = 0; i < 3 && !want; i++)
        if (fsdp_tokenizer_token_id(r->tok, candidates[i], strlen(candidates[i]), &r->eos)) return 0;
    if (!want)
        return fsdp_usagef(err, "prepare: %s has none of </s>, <|end_of_text|>, <|endoftext|>: name the EOS token with "
                                "--eos-token", r->o->tokenizer);
    if (!fsdp_tokenizer_token_id(r->tok, want, strlen(want), &r->eos))
        return fsdp_usagef(err, "prepare: --eos-token '%s' is not a token of %s", want, r->o->tokenizer);
    return 0;
}

/* The files prepare writes (the training file, the validation file, the writer's temporaries beside
 * each) are none of those it reads: the inputs and the tokenizer (base/output_paths.h). */
static int outputs_apart(const fsdp_prepare_options *o, const char *val_path, fsdp_err *err) {
    enum { PER_FILE = sizeof WRITER_TEMPORARIES / sizeof WRITER_TEMPORARIES[0] };
    static const char *const FLAGS[2][PER_FILE] = {
        {"--out", "--out's temporary", "--out's temporary", "--out's temporary"},
        {"--out's validation file", "the validation file's temporary", "the validation file's temporary",
         "the validation file's temporary"}};
    char paths[2][PER_FILE][4300];
    fsdp_io_path outputs[2 * PER_FILE];
    int n = 0;
    for (int v = 0; v < (val_path ? 2 : 1); v++)
        for (int k = 0; k < PER_FILE; k++) {
            snprintf(paths[v][k], sizeof paths[v][k], "%s%s", v ? val_path : o->out, WRITER_TEMPORARIES[k]);
            outputs[n++] = FSDP_IO_FILE(FLAGS[v][k], paths[v][k]);
        }
    /* the tokenizer's files: a directory argument names the tokenizer.json in it, and a config beside */
    char json[4300], config[4300];
    if (fsdp_tokenizer_files(o->tokenizer, json, sizeof json, config, sizeof config, err)) return -1;
    fsdp_io_path *inputs = fsdp_xcalloc((size_t)o->num_inputs + 2, sizeof *inputs, "prepare's inputs");
    for (int i = 0; i < o->num_inputs; i++) inputs[i] = FSDP_IO_FILE("--input", o->inputs[i]);
    int m = o->num_inputs;
    inputs[m++] = FSDP_IO_FILE("--tokenizer", json);
    if (config[0]) inputs[m++] = FSDP_IO_FILE("--tokenizer's tokenizer_config.json", config);
    int rc = fsdp_outputs_apart(outputs, n, inputs, m, err);
    free(inputs);
    return rc;
}

/* Refuses inputs up front (before any work): unreadable, not regular, or an output. */
static int check_inputs(const fsdp_prepare_options *o, const char *val_path, uint64_t *total, fsdp_err *err) {
    *total = 0;
    for (int i = 0; i < o->num_inputs; i++) {
        if (fsdp_docs_check_path(o->inputs[i], err)) return -1;
        struct stat st;
        if (stat(o->inputs[i], &st) != 0) return fsdp_errf(err, "%s: %s", o->inputs[i], strerror(errno));
        if (access(o->inputs[i], R_OK) != 0) return fsdp_errf(err, "%s: not readable", o->inputs[i]);
        *total += (uint64_t)st.st_size;
    }
    return outputs_apart(o, val_path, err);
}

/* A training file without documents trains nothing: refused before it is published. */
static int training_not_empty(const fsdp_prepare_options *o, const fsdp_prepare_stats *st, fsdp_err *err) {
    if (st->documents[0] > 0) return 0;
    if (st->documents[1] > 0)
        return fsdp_usagef(err, "prepare: --val-fraction %g sent all %llu documents to the validation file and left "
                                "the training file %s empty; nothing was written: give a smaller --val-fraction",
                           o->val_fraction, (unsigned long long)st->documents[1], o->out);
    return fsdp_errf(err, "prepare: no document of the input gave a token: the training file %s would be empty; "
                          "nothing was written", o->out);
}

static int process_inputs(run *r, fsdp_prepare_stats *st, fsdp_err *err) {
    for (int i = 0; i < r->o->num_inputs; i++) {
        fsdp_docs_reader *rd = fsdp_docs_open(r->o->inputs[i], r->o->format, r->o->field, r->budget, err);
        if (!rd) return -1;
        fsdp_document d;
        int rc;
        while ((rc = fsdp_docs_next(rd, &d, err)) > 0) {
            /* Tokenized before a document that would take the group past its budget. */
            if (r->num_docs && r->group_bytes + document_bytes(r, &d) > r->budget && flush_group(r, st, err)) rc = -1;
            if (rc < 0) break;
            add_document(r, &d, i);
            progress(r, fsdp_docs_bytes(rd), 0);
        }
        r->done_bytes += fsdp_docs_bytes(rd);
        st->nulls += fsdp_docs_nulls(rd);
        fsdp_docs_close(rd);
        if (rc < 0) return -1;
    }
    return flush_group(r, st, err);
}

int fsdp_prepare(const fsdp_prepare_options *o, fsdp_prepare_stats *st, fsdp_err *err) {
    memset(st, 0, sizeof *st);
    char val_path[4200];
    fsdp_prepare_val_path(o->out, val_path, sizeof val_path);
    run r = {0};
    r.o = o;
    r.start = now();
    if (check_inputs(o, o->val_fraction > 0 ? val_path : NULL, &r.total_bytes, err)) return -1;
    r.tok = fsdp_tokenizer_load(o->tokenizer, err);
    if (!r.tok) return -1;
    r.last_print = now(); /* the first progress line comes after some work */
    r.alpaca = o->format == FSDP_DOCS_ALPACA;
    r.budget = o->max_memory / MEMORY_PER_TEXT_BYTE;
#ifdef M_MMAP_THRESHOLD
    /* glibc raises its mmap threshold to the largest block freed (up to 32 MiB); blocks below it
     * come from the thread's arena and stay there when freed, so every thread kept a large
     * document's worth and peak RSS grew with --threads (at --max-memory 200, one 3 MB document
     * per group: 174 MB at 2 threads, 282 MB at 4, 307 MB at 8). A fixed threshold hands every block
     * above 1 MiB back to the kernel when it is freed: 174 MB at any thread count. Another
     * allocator (AddressSanitizer's) refuses the setting: it has nothing of the kind to tune. */
    (void)mallopt(M_MMAP_THRESHOLD, 1 << 20);
#endif
    int rc = r.alpaca ? eos_of(&r, err) : 0;
    st->vocab_size = fsdp_tokenizer_vocab_size(r.tok);
    st->tokenizer_hash = fsdp_tokenizer_hash(r.tok);
    st->model_max_length = fsdp_tokenizer_model_max_length(r.tok);
    if (rc == 0) {
        r.writers[0] = fsdp_tokens_writer_open(o->out, st->vocab_size, st->tokenizer_hash, r.alpaca, err);
        if (!r.writers[0]) rc = -1;
    }
    if (rc == 0 && o->val_fraction > 0) {
        r.writers[1] = fsdp_tokens_writer_open(val_path, st->vocab_size, st->tokenizer_hash, r.alpaca, err);
        if (!r.writers[1]) rc = -1;
    }
    /* where the tokenizer is, for `fsdp export` to find it again (it checks the hash then) */
    char tokenizer_path[4096];
    if (rc == 0 && !realpath(o->tokenizer, tokenizer_path))
        rc = fsdp_errf(err, "--tokenizer %s: realpath: %s", o->tokenizer, strerror(errno));
    for (int v = 0; v < 2 && rc == 0; v++)
        if (r.writers[v]) rc = fsdp_tokens_writer_set_tokenizer(r.writers[v], tokenizer_path, err);
    if (rc == 0) {
        r.states = fsdp_xcalloc((size_t)o->threads, sizeof *r.states, "tokenizer states");
        r.outputs = fsdp_xcalloc((size_t)o->threads, sizeof *r.outputs, "token buffers");
        r.largest = fsdp_xcalloc((size_t)o->threads, sizeof *r.largest, "document sizes");
        for (int t = 0; t < o->threads; t++) r.states[t] = fsdp_tokenizer_state_new(r.tok);
        rc = process_inputs(&r, st, err);
        if (rc == 0) rc = training_not_empty(o, st, err);
        if (rc == 0) progress(&r, 0, 1);
    }
    if (rc == 0) rc = fsdp_tokens_writer_finish(r.writers[0], err), r.writers[0] = NULL;
    if (rc == 0 && r.writers[1]) rc = fsdp_tokens_writer_finish(r.writers[1], err), r.writers[1] = NULL;
    fsdp_tokens_writer_abort(r.writers[0]);
    fsdp_tokens_writer_abort(r.writers[1]);
    for (int t = 0; r.states && t < o->threads; t++) {
        fsdp_tokenizer_state_free(r.states[t]);
        fsdp_ids_free(&r.outputs[t]);
    }
    free(r.states);
    free(r.outputs);
    free(r.largest);
    free(r.errors);
    free(r.docs);
    fsdp_buf_free(&r.mask);
    fsdp_arena_free(&r.arena);
    fsdp_tokenizer_free(r.tok);
    st->bytes = r.done_bytes;
    st->seconds = now() - r.start;
    return rc;
}
