/* The stream of documents joined with EOS (data_stream.h).
 *
 * Document d starts at stream position p(d) = s[d] + inserted(d): its start in the file plus the EOS
 * inserted after the documents before it. One bit per document (EOS after it or not) and a running
 * count every 64 documents give inserted(d) without a table of positions; the document starts are
 * read from the file when a window needs them (a binary search over p for the window's first
 * document, then the documents that follow). */
#include "data_stream.h"

#include <stdlib.h>
#include <string.h>

#include "../base/log.h"

#define SCAN_DOCS 4096            /* document starts read at once while scanning */
#define SCAN_SPAN (1 << 20)       /* tokens read at once when a run of documents is that short */

static int eos_after(const fsdp_data *d, uint64_t doc) { return (int)((d->eos_after[doc / 64] >> (doc % 64)) & 1); }

static uint64_t inserted_before(const fsdp_data *d, uint64_t doc) {
    uint64_t word = doc / 64, bits = doc % 64;
    uint64_t below = bits ? d->eos_after[word] & ((1ull << bits) - 1) : 0;
    return d->eos_before[word] + (uint64_t)__builtin_popcountll(below);
}

/* Whether EOS goes after a non-empty document that ends at file position `end`: not when it ends
 * with EOS or the next document starts with it. `span` holds tokens [span_start, ...) when non-NULL. */
static int needs_eos(const fsdp_data *d, uint64_t end, const int32_t *span, uint64_t span_start, fsdp_err *err) {
    const fsdp_token_file *f = &d->file;
    int32_t around[2];
    int k = end < f->count ? 2 : 1;
    if (span) {
        memcpy(around, span + (end - 1 - span_start), (size_t)k * sizeof(int32_t));
    } else if (fsdp_tokens_read(f, end - 1, k, around, err)) {
        return -1;
    }
    return around[0] != d->eos_id && !(k == 2 && around[1] == d->eos_id);
}

int fsdp_stream_build(fsdp_data *d, fsdp_err *err) {
    const fsdp_token_file *f = &d->file;
    if (d->eos_id < 0 || f->version == 1) {
        d->stream_len = f->count;
        return 0;
    }
    uint64_t D = f->num_documents, words = D / 64 + 1;
    d->eos_after = fsdp_xcalloc((size_t)words, sizeof(uint64_t), "the stream's EOS bits");
    d->eos_before = fsdp_xcalloc((size_t)words, sizeof(uint64_t), "the stream's EOS counts");
    uint64_t *starts = fsdp_xmalloc((SCAN_DOCS + 1) * sizeof(uint64_t), "document starts");
    int32_t *span = fsdp_xmalloc((SCAN_SPAN + 1) * sizeof(int32_t), "the tokens around document ends");
    double t0 = fsdp_now(), last = t0;
    int rc = 0;
    for (uint64_t first = 0; first < D && rc == 0; first += SCAN_DOCS) {
        uint64_t n = D - first < SCAN_DOCS ? D - first : SCAN_DOCS;
        if (fsdp_tokens_documents(f, first, n, starts, err)) {
            rc = -1;
            break;
        }
        /* Short documents: one read for the whole run (and the next document's first token). */
        uint64_t lo = starts[0], hi = starts[n] < f->count ? starts[n] + 1 : starts[n];
        int whole = hi - lo <= SCAN_SPAN;
        if (whole && hi > lo && fsdp_tokens_read(f, lo, (int)(hi - lo), span, err)) {
            rc = -1;
            break;
        }
        for (uint64_t i = 0; i < n; i++) {
            if (starts[i + 1] == starts[i]) continue; /* an empty document adds nothing, not even EOS */
            int eos = needs_eos(d, starts[i + 1], whole ? span : NULL, lo, err);
            if (eos < 0) {
                rc = -1;
                break;
            }
            if (eos) d->eos_after[(first + i) / 64] |= 1ull << ((first + i) % 64);
        }
        double now = fsdp_now();
        if (now - last >= 10.0) {
            last = now;
            double done = (double)(first + n) / (double)D;
            fsdp_log("%s %s: finding document ends, %.0f%% of %llu documents, ETA %.0f s\n", d->flag, f->path,
                     100.0 * done, (unsigned long long)D, (now - t0) * (1.0 - done) / done);
        }
    }
    free(starts);
    free(span);
    if (rc) return -1;
    uint64_t running = 0;
    for (uint64_t w = 0; w < words; w++) {
        d->eos_before[w] = running;
        running += (uint64_t)__builtin_popcountll(d->eos_after[w]);
    }
    d->inserted = running;
    d->stream_len = f->count + running;
    return 0;
}

/* The document holding stream position `pos`: the last d with p(d) <= pos (an empty document
 * shares its p with the next and is never chosen over it). */
static int doc_at(const fsdp_data *d, uint64_t pos, uint64_t *doc, fsdp_err *err) {
    uint64_t lo = 0, hi = d->file.num_documents - 1; /* p(0) = 0 <= pos */
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo + 1) / 2, start;
        if (fsdp_tokens_documents(&d->file, mid, 0, &start, err)) return -1;
        if (start + inserted_before(d, mid) <= pos)
            lo = mid;
        else
            hi = mid - 1;
    }
    *doc = lo;
    return 0;
}

int fsdp_stream_read(fsdp_data *d, uint64_t pos, int n, fsdp_err *err) {
    const fsdp_token_file *f = &d->file;
    if (!d->eos_after) {
        if (fsdp_tokens_read(f, pos, n, d->tokens, err)) return -1;
        return fsdp_tokens_read_mask(f, pos, n, d->mask, err);
    }
    uint64_t doc, se[2];
    if (doc_at(d, pos, &doc, err) || fsdp_tokens_documents(f, doc, 1, se, err)) return -1;
    uint64_t off = pos - (se[0] + inserted_before(d, doc));
    int filled = 0;
    for (;;) {
        uint64_t len = se[1] - se[0];
        if (off < len) {
            uint64_t left = len - off;
            int k = left < (uint64_t)(n - filled) ? (int)left : n - filled;
            if (fsdp_tokens_read(f, se[0] + off, k, d->tokens + filled, err) ||
                fsdp_tokens_read_mask(f, se[0] + off, k, d->mask + filled, err))
                return -1;
            filled += k;
            off += (uint64_t)k;
        }
        if (filled < n && off == len && eos_after(d, doc)) {
            d->tokens[filled] = d->eos_id;
            d->mask[filled] = 1; /* the end of a document is a prediction like any other */
            filled++;
        }
        if (filled == n) return 0;
        if (++doc >= f->num_documents)
            return fsdp_errf(err, "internal error: stream position %llu + %d is past the end of %s",
                             (unsigned long long)pos, n, f->path);
        se[0] = se[1];
        if (fsdp_tokens_documents(f, doc + 1, 0, &se[1], err)) return -1;
        off = 0;
    }
}

void fsdp_stream_free(fsdp_data *d) {
    free(d->eos_after);
    free(d->eos_before);
    d->eos_after = d->eos_before = NULL;
}
