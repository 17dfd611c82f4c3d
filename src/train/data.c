/* Synthetic and file-backed samples, deterministic in (seed, sample index). */
#include "data.h"

#include <string.h>

#include "../base/rng.h"

enum { STREAM_SYNTHETIC = 0x5a17, STREAM_EPOCH = 0xe90c };

int fsdp_data_open(fsdp_data *d, const char *spec, int synthetic_vocab, int vocab_size, int seq, uint64_t seed,
                   fsdp_err *err) {
    memset(d, 0, sizeof *d);
    d->file.fd = -1;
    d->seed = seed;
    d->seq = seq;
    if (!spec || !strcmp(spec, "synthetic")) {
        if (synthetic_vocab > vocab_size)
            return fsdp_usagef(err,
                               "--synthetic-vocab %d exceeds the model's vocabulary of %d tokens (pass "
                               "--synthetic-vocab %d or less)",
                               synthetic_vocab, vocab_size, vocab_size);
        d->synthetic = 1;
        d->synthetic_vocab = synthetic_vocab;
        return 0;
    }
    if (fsdp_tokens_open(spec, &d->file, err)) return -1;
    if (d->file.vocab_size > (uint64_t)vocab_size) {
        fsdp_errf(err, "%s: the token file's vocabulary (%llu) is larger than the model's (%d)", spec,
                  (unsigned long long)d->file.vocab_size, vocab_size);
        fsdp_tokens_close(&d->file);
        return -1;
    }
    if (d->file.count < (uint64_t)seq + 1) {
        fsdp_errf(err, "%s: %llu tokens are fewer than one sample of --seq %d + 1", spec,
                  (unsigned long long)d->file.count, seq);
        fsdp_tokens_close(&d->file);
        return -1;
    }
    d->windows = (d->file.count - 1) / (uint64_t)seq;
    return 0;
}

void fsdp_data_close(fsdp_data *d) {
    if (!d->synthetic && d->file.fd >= 0) fsdp_tokens_close(&d->file);
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

int fsdp_data_sample(const fsdp_data *d, uint64_t index, int32_t *inputs, int32_t *targets, fsdp_err *err) {
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
    uint64_t epoch = index / d->windows, pos = index % d->windows;
    uint64_t window = permute(pos, d->windows, fsdp_rand_u64(d->seed, STREAM_EPOCH, epoch));
    /* Targets are the inputs shifted by one; the page cache serves the overlapping second read. */
    if (fsdp_tokens_read(&d->file, window * (uint64_t)T, T, inputs, err)) return -1;
    return fsdp_tokens_read(&d->file, window * (uint64_t)T + 1, T, targets, err);
}
