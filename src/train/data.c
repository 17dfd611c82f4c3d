/* Synthetic and file-backed samples, deterministic in (seed, sample index): data.h. */
#include "data.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../base/rng.h"
#include "../io/special_tokens.h"
#include "../io/tokenizer_json.h"
#include "data_stream.h"

enum { STREAM_SYNTHETIC = 0x5a17, STREAM_EPOCH = 0xe90c };

const char *fsdp_packing_name(fsdp_packing p) { return p == FSDP_PACK_PAD ? "pad" : "stream"; }

/* pad keeps an example's first `keep` tokens: the examples longer than that, and what they lose, are
 * counted from the document table (read in blocks, so memory stays bounded) and said in the run's
 * description, since training silently on the start of each long example changes what it learns. */
static int count_cut(fsdp_data *d, uint64_t keep, fsdp_err *err) {
    enum { BLOCK = 4096 };
    uint64_t *starts = fsdp_xmalloc((BLOCK + 1) * sizeof *starts, "the document table");
    int rc = 0;
    for (uint64_t first = 0; first < d->file.num_documents && rc == 0; first += BLOCK) {
        uint64_t n = d->file.num_documents - first < BLOCK ? d->file.num_documents - first : BLOCK;
        rc = fsdp_tokens_documents(&d->file, first, n, starts, err);
        for (uint64_t i = 0; i < n && rc == 0; i++) {
            uint64_t len = starts[i + 1] - starts[i];
            if (len > keep) d->cut++, d->cut_tokens += len - keep;
        }
    }
    free(starts);
    return rc;
}

static int open_file(fsdp_data *d, const fsdp_data_spec *s, fsdp_err *err) {
    const fsdp_token_file *f = &d->file;
    const char *path = s->path;
    if (f->vocab_size > (uint64_t)s->vocab_size)
        return fsdp_errf(err, "%s %s: the token file's vocabulary (%llu ids, from its tokenizer) does not fit the "
                         "model's %d: it was made with another tokenizer than the model's", d->flag, path,
                         (unsigned long long)f->vocab_size, s->vocab_size);
    d->packing = s->packing != FSDP_PACK_AUTO ? s->packing : f->has_mask ? FSDP_PACK_PAD : FSDP_PACK_STREAM;
    if (d->packing == FSDP_PACK_PAD && f->version == 1)
        return fsdp_usagef(err, "%s %s: --packing pad needs documents, and a version 1 token file is one stream without "
                           "them (write the file with fsdp prepare, or use --packing stream)", d->flag, path);
    int32_t pad = s->pad_id >= 0 ? s->pad_id : s->eos_id >= 0 ? s->eos_id : 0;
    if (pad >= s->vocab_size || s->eos_id >= s->vocab_size)
        return fsdp_errf(err, "the model's pad or EOS id (%d, %d) is not below its vocabulary size %d", s->pad_id,
                         s->eos_id, s->vocab_size);
    d->pad_id = pad;
    d->eos_id = -1;
    if (d->packing == FSDP_PACK_STREAM && f->version == 2) {
        if (s->eos_id < 0)
            return fsdp_usagef(err, "%s %s: --packing stream joins the documents with EOS, and the model has no "
                               "eos_token_id (give a config.json that sets it, or --packing pad)", d->flag, path);
        d->eos_id = s->eos_id;
    }
    if (d->packing == FSDP_PACK_PAD) {
        if (f->num_documents == 0) return fsdp_errf(err, "%s %s: the file holds no documents", d->flag, path);
        d->samples = f->num_documents;
        if (count_cut(d, (uint64_t)s->seq + 1, err)) return -1;
    } else {
        if (fsdp_stream_build(d, err)) return -1;
        uint64_t T = (uint64_t)s->seq, predicted = d->stream_len > 0 ? d->stream_len - 1 : 0;
        /* Training takes whole windows; evaluation predicts every token, the last window shorter. */
        d->samples = s->eval ? (predicted + T - 1) / T : predicted / T;
        if (d->samples == 0)
            return fsdp_errf(err, "%s %s: %llu tokens are fewer than one sample of --seq %d + 1", d->flag, path,
                             (unsigned long long)d->stream_len, s->seq);
    }
    d->tokens = fsdp_xmalloc(((size_t)s->seq + 1) * sizeof(int32_t), "a sample's tokens");
    d->mask = fsdp_xmalloc((size_t)s->seq + 1, "a sample's mask");
    return fsdp_data_require_targets(d, err);
}

int fsdp_data_open(fsdp_data *d, const fsdp_data_spec *s, fsdp_err *err) {
    memset(d, 0, sizeof *d);
    d->file.fd = -1;
    d->seed = s->seed;
    d->seq = s->seq;
    d->eval = s->eval;
    snprintf(d->flag, sizeof d->flag, "%s", s->flag ? s->flag : "--data");
    if (!s->path || !strcmp(s->path, "synthetic")) {
        if (s->synthetic_vocab > s->vocab_size)
            return fsdp_usagef(err,
                               "--synthetic-vocab %d exceeds the model's vocabulary of %d tokens (pass "
                               "--synthetic-vocab %d or less)",
                               s->synthetic_vocab, s->vocab_size, s->vocab_size);
        d->synthetic = 1;
        d->synthetic_vocab = s->synthetic_vocab;
        return 0;
    }
    if (fsdp_tokens_open(s->path, &d->file, err)) {
        /* The reader names the file; say which flag gave it. */
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "%s", err->msg);
        return fsdp_errf(err, "%s %s", d->flag, msg);
    }
    if (open_file(d, s, err)) {
        fsdp_data_close(d);
        return -1;
    }
    return 0;
}

void fsdp_data_close(fsdp_data *d) {
    /* A zeroed fsdp_data (never opened) has no path, and fd 0 is not its own. */
    if (!d->synthetic && d->file.path[0] && d->file.fd >= 0) fsdp_tokens_close(&d->file);
    fsdp_stream_free(d);
    free(d->tokens);
    free(d->mask);
    d->tokens = NULL;
    d->mask = NULL;
}

/* A bijection of [0, n) keyed by `key`: a 4-round Feistel network on the smallest even number of
 * bits that covers n, walked until the value falls inside. */
static uint64_t permute(uint64_t x, uint64_t n, uint64_t key) {
    int bits = 2;
    while (bits < 62 && (1ull << bits) < n) bits += 2;
    int half = bits / 2;
    uint64_t mask = (1ull << half) - 1;
    do {
        uint64_t l = x >> half, r = x & mask;
        for (uint64_t round = 0; round < 4; round++) {
            uint64_t f = fsdp_rand_u64(key, round, r) & mask;
            uint64_t t = r;
            r = l ^ f;
            l = t;
        }
        x = (l << half) | r;
    } while (x >= n);
    return x;
}

/* inputs/targets from d->tokens[0, n) and d->mask: padded past n, -1 where nothing counts. */
static void fill(const fsdp_data *d, int n, int32_t *inputs, int32_t *targets) {
    for (int i = 0; i < d->seq; i++) {
        inputs[i] = i < n ? d->tokens[i] : d->pad_id;
        targets[i] = i + 1 < n && d->mask[i + 1] ? d->tokens[i + 1] : -1;
    }
}

static int read_unit(fsdp_data *d, uint64_t unit, int32_t *inputs, int32_t *targets, fsdp_err *err);

int fsdp_data_sample(fsdp_data *d, uint64_t index, int32_t *inputs, int32_t *targets, fsdp_err *err) {
    int T = d->seq;
    if (d->synthetic) {
        int32_t prev = (int32_t)fsdp_rand_below(d->seed, STREAM_SYNTHETIC + index, 0, (uint32_t)d->synthetic_vocab);
        for (int i = 0; i < T; i++) {
            int32_t next =
                (int32_t)fsdp_rand_below(d->seed, STREAM_SYNTHETIC + index, (uint64_t)i + 1, (uint32_t)d->synthetic_vocab);
            inputs[i] = prev;
            targets[i] = next;
            prev = next;
        }
        return 0;
    }
    uint64_t unit;
    if (d->eval) {
        if (index >= d->samples) { /* the rows that fill the last micro-batch: nothing counts */
            fill(d, 0, inputs, targets);
            return 0;
        }
        unit = index;
    } else {
        uint64_t epoch = index / d->samples, pos = index % d->samples;
        unit = permute(pos, d->samples, fsdp_rand_u64(d->seed, STREAM_EPOCH, epoch));
    }
    return read_unit(d, unit, inputs, targets, err);
}

/* Window or example `unit` of the file, in file order. */
static int read_unit(fsdp_data *d, uint64_t unit, int32_t *inputs, int32_t *targets, fsdp_err *err) {
    int T = d->seq, n;
    if (d->packing == FSDP_PACK_PAD) {
        uint64_t se[2];
        if (fsdp_tokens_documents(&d->file, unit, 1, se, err)) return -1;
        n = se[1] - se[0] < (uint64_t)T + 1 ? (int)(se[1] - se[0]) : T + 1; /* truncated to seq + 1 */
        if (fsdp_tokens_read(&d->file, se[0], n, d->tokens, err) ||
            fsdp_tokens_read_mask(&d->file, se[0], n, d->mask, err))
            return -1;
    } else {
        uint64_t start = unit * (uint64_t)T, left = d->stream_len - start;
        n = left < (uint64_t)T + 1 ? (int)left : T + 1; /* shorter only at the end of an evaluation */
        if (fsdp_stream_read(d, start, n, err)) return -1;
    }
    fill(d, n, inputs, targets);
    return 0;
}

int fsdp_data_require_targets(fsdp_data *d, fsdp_err *err) {
    if (d->synthetic) return 0;
    int32_t *inputs = fsdp_xmalloc((size_t)d->seq * sizeof(int32_t), "a sample's inputs");
    int32_t *targets = fsdp_xmalloc((size_t)d->seq * sizeof(int32_t), "a sample's targets");
    int found = 0, rc = 0;
    /* Usually the first sample has a target; only a file with none is read to its end. */
    for (uint64_t u = 0; u < d->samples && !found && rc == 0; u++) {
        rc = read_unit(d, u, inputs, targets, err);
        for (int i = 0; rc == 0 && i < d->seq && !found; i++) found = targets[i] >= 0;
    }
    free(inputs);
    free(targets);
    if (rc || found) return rc;
    return fsdp_errf(err, "%s %s: no token of it counts in the loss (every target is masked or padding%s): %s would "
                     "learn nothing", d->flag, d->file.path,
                     d->packing == FSDP_PACK_PAD ? "; an example keeps only its first --seq + 1 tokens, so a prompt "
                                                   "that long leaves no response token"
                                                 : "",
                     d->eval ? "evaluating it" : "training on it");
}

int fsdp_data_epoch_steps(const fsdp_data *d, double epochs, uint64_t global_batch, int *steps, fsdp_err *err) {
    if (d->synthetic)
        return fsdp_usagef(err, "--epochs needs a token file (--data FILE): synthetic data has no epochs; use --steps");
    double s = ceil(epochs * (double)d->samples / (double)global_batch);
    if (s < 1) s = 1;
    if (s > (double)(1 << 30))
        return fsdp_usagef(err, "--epochs %g of %llu samples at %llu per step is more than %d steps", epochs,
                           (unsigned long long)d->samples, (unsigned long long)global_batch, 1 << 30);
    *steps = (int)s;
    return 0;
}

int fsdp_data_check_tokenizer(const fsdp_data *d, const char *tokenizer_json, fsdp_err *err) {
    struct stat st;
    if (d->synthetic || d->file.tokenizer_hash == 0 || stat(tokenizer_json, &st) != 0) return 0;
    uint64_t hash;
    if (fsdp_tokenizer_identity_hash(tokenizer_json, &hash, err)) return -1;
    if (hash != d->file.tokenizer_hash)
        return fsdp_errf(err, "%s %s was made with another tokenizer than the model's %s (tokenizer hash %016llx in the "
                         "file, %016llx of the model's): prepare it again with --tokenizer %s", d->flag, d->file.path,
                         tokenizer_json, (unsigned long long)d->file.tokenizer_hash, (unsigned long long)hash,
                         tokenizer_json);
    return 0;
}

fsdp_data_identity fsdp_data_identity_of(const fsdp_data *d) {
    fsdp_data_identity id = {d->synthetic, 0, (uint64_t)d->synthetic_vocab};
    if (!d->synthetic) id.tokenizer_hash = d->file.tokenizer_hash, id.vocab_size = d->file.vocab_size;
    return id;
}

int fsdp_data_identity_differs(const fsdp_data_identity *a, const fsdp_data_identity *b) {
    if (a->synthetic != b->synthetic || a->vocab_size != b->vocab_size) return 1;
    return a->tokenizer_hash && b->tokenizer_hash && a->tokenizer_hash != b->tokenizer_hash;
}

void fsdp_data_describe(const fsdp_data *d, char *buf, size_t cap) {
    if (d->synthetic) {
        snprintf(buf, cap, "synthetic tokens in [0, %d)", d->synthetic_vocab);
        return;
    }
    const fsdp_token_file *f = &d->file;
    char how[256];
    if (d->packing == FSDP_PACK_PAD)
        snprintf(how, sizeof how, "pad: %llu examples, each truncated to %d + 1 tokens (%llu cut, %llu tokens past "
                 "the cut not %s), padded with %d",
                 (unsigned long long)d->samples, d->seq, (unsigned long long)d->cut, (unsigned long long)d->cut_tokens,
                 d->eval ? "scored" : "trained on", d->pad_id);
    else if (d->eos_id >= 0)
        snprintf(how, sizeof how, "stream: %llu windows of %d + 1 tokens, %llu EOS (%d) inserted between documents",
                 (unsigned long long)d->samples, d->seq, (unsigned long long)d->inserted, d->eos_id);
    else
        snprintf(how, sizeof how, "stream: %llu windows of %d + 1 tokens", (unsigned long long)d->samples, d->seq);
    snprintf(buf, cap, "%s (version %d, %llu tokens in %llu documents%s) | %s%s", f->path, f->version,
             (unsigned long long)f->count, (unsigned long long)f->num_documents,
             f->has_mask ? ", loss mask" : "", how, d->eval ? ", each once" : "");
}
