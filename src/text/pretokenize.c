/* Pre-tokenizers of pretokenize.h. */
#include "pretokenize.h"

#include <stdio.h>
#include <stdlib.h>

#include "byte_level.h"

/* tokenizers' ByteLevel regex (GPT-2's). */
static const char GPT2_PATTERN[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

struct fsdp_pretok_segment {
    uint32_t start, end;
    int match;
};

int fsdp_pretokenizer_init(fsdp_pretokenizer *p, const fsdp_tokenizer_spec *spec, const char *file, fsdp_err *err) {
    p->num_steps = spec->num_pretokenizers;
    p->steps = fsdp_xcalloc((size_t)p->num_steps + 1, sizeof *p->steps, "pre-tokenizer");
    for (int i = 0; i < p->num_steps; i++) {
        const fsdp_tj_pretokenizer *t = &spec->pretokenizers[i];
        p->steps[i].spec = t;
        char what[1200];
        if (t->kind == FSDP_TJ_PRE_SPLIT) {
            snprintf(what, sizeof what, "%s: %s.pattern", file, t->field);
            if (fsdp_regex_compile(&p->steps[i].re, t->pattern.s, t->pattern.n, !t->regex, what, err)) return -1;
        } else if (t->use_regex) {
            snprintf(what, sizeof what, "%s: %s (ByteLevel's GPT-2 regex)", file, t->field);
            if (fsdp_regex_compile(&p->steps[i].re, GPT2_PATTERN, sizeof GPT2_PATTERN - 1, 0, what, err)) return -1;
        }
    }
    return 0;
}

void fsdp_pretokenizer_free(fsdp_pretokenizer *p) {
    for (int i = 0; i < p->num_steps; i++)
        if (p->steps[i].re.code) fsdp_regex_free(&p->steps[i].re);
    free(p->steps);
    p->steps = NULL, p->num_steps = 0;
}

void fsdp_pretok_scratch_free(fsdp_pretok_scratch *s) {
    free(s->matches.p);
    free(s->segs);
    fsdp_pieces_free(&s->tmp);
    memset(s, 0, sizeof *s);
}

static void add_seg(fsdp_pretok_scratch *s, size_t *n, uint32_t start, uint32_t end, int match) {
    if (*n == s->cap_segs) {
        s->cap_segs = s->cap_segs ? 2 * s->cap_segs : 64;
        s->segs = realloc(s->segs, s->cap_segs * sizeof *s->segs);
        if (!s->segs) fsdp_fatal("out of host memory (pre-tokenizer)");
    }
    s->segs[*n].start = start, s->segs[*n].end = end, s->segs[*n].match = match;
    (*n)++;
}

/* Cuts one piece by the matches in s->matches per the behaviour; appends the parts to out. */
static void split_piece(fsdp_pretok_scratch *s, const char *text, uint32_t n, fsdp_split_behavior behavior,
                        int invert, fsdp_pieces *out) {
    size_t k = 0;
    uint32_t prev = 0;
    for (size_t i = 0; i < s->matches.n; i++) {
        fsdp_span m = s->matches.p[i];
        if (prev != m.start) add_seg(s, &k, prev, m.start, 0);
        add_seg(s, &k, m.start, m.end, 1);
        prev = m.end;
    }
    if (prev != n) add_seg(s, &k, prev, n, 0);
    struct fsdp_pretok_segment *g = s->segs;
    if (invert)
        for (size_t i = 0; i < k; i++) g[i].match = !g[i].match;
    size_t m = 0; /* the segments kept, rewritten in place */
    int previous = 0;
    switch (behavior) {
    case FSDP_SPLIT_REMOVED:
        for (size_t i = 0; i < k; i++)
            if (!g[i].match) g[m++] = g[i];
        break;
    case FSDP_SPLIT_ISOLATED: m = k; break;
    case FSDP_SPLIT_MERGED_WITH_PREVIOUS:
        for (size_t i = 0; i < k; i++) {
            if (g[i].match && !previous && m > 0) g[m - 1].end = g[i].end;
            else g[m++] = g[i];
            previous = g[i].match;
        }
        break;
    case FSDP_SPLIT_MERGED_WITH_NEXT: {
        /* walked backwards, kept from the end of the array down */
        size_t top = k;
        for (size_t i = k; i-- > 0;) {
            struct fsdp_pretok_segment cur = g[i];
            if (cur.match && !previous && top < k) g[top].start = cur.start;
            else g[--top] = cur;
            previous = cur.match;
        }
        memmove(g, g + top, (k - top) * sizeof *g);
        m = k - top;
        break;
    }
    case FSDP_SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < k; i++) {
            if (g[i].match == previous && m > 0) g[m - 1].end = g[i].end;
            else g[m++] = g[i];
            previous = g[i].match;
        }
        break;
    }
    for (size_t i = 0; i < m; i++)
        if (g[i].end > g[i].start) fsdp_pieces_push(out, text + g[i].start, g[i].end - g[i].start, -1);
}

static void byte_level_map(fsdp_arena *arena, const char *text, size_t n, fsdp_pieces *out) {
    char *t = fsdp_arena_alloc(arena, 2 * n);
    size_t len;
    fsdp_byte_level_encode(text, n, t, &len);
    fsdp_pieces_push(out, t, len, -1);
}

static int run_step(const fsdp_pretok_step *step, fsdp_regex_scratch *x, fsdp_pretok_scratch *s, fsdp_arena *arena,
                    const fsdp_piece *in, fsdp_pieces *out, fsdp_err *err) {
    const fsdp_tj_pretokenizer *t = step->spec;
    if (t->kind == FSDP_TJ_PRE_SPLIT) {
        if (fsdp_regex_find_all(&step->re, x, in->s, in->n, &s->matches, err)) return -1;
        split_piece(s, in->s, in->n, t->behavior, t->invert, out);
        return 0;
    }
    const char *text = in->s;
    size_t n = in->n;
    if (t->add_prefix_space && (n == 0 || text[0] != ' ')) {
        char *p = fsdp_arena_alloc(arena, n + 1);
        p[0] = ' ';
        memcpy(p + 1, text, n);
        text = p, n++;
    }
    if (!t->use_regex) {
        byte_level_map(arena, text, n, out);
        return 0;
    }
    if (fsdp_regex_find_all(&step->re, x, text, n, &s->matches, err)) return -1;
    size_t first = out->n;
    split_piece(s, text, (uint32_t)n, FSDP_SPLIT_ISOLATED, 0, out);
    /* map the parts just added, in place */
    size_t last = out->n;
    for (size_t i = first; i < last; i++) {
        fsdp_piece part = out->p[i];
        char *m = fsdp_arena_alloc(arena, 2 * (size_t)part.n);
        size_t len;
        fsdp_byte_level_encode(part.s, part.n, m, &len);
        out->p[i].s = m, out->p[i].n = (uint32_t)len;
    }
    return 0;
}

int fsdp_pretokenize(const fsdp_pretokenizer *p, fsdp_regex_scratch *x, fsdp_pretok_scratch *s, fsdp_arena *arena,
                     fsdp_pieces *pieces, fsdp_err *err) {
    for (int i = 0; i < p->num_steps; i++) {
        fsdp_pieces *out = &s->tmp;
        out->n = 0;
        for (size_t k = 0; k < pieces->n; k++) {
            const fsdp_piece *in = &pieces->p[k];
            if (in->id >= 0) {
                fsdp_pieces_push(out, in->s, in->n, in->id);
                continue;
            }
            if (run_step(&p->steps[i], x, s, arena, in, out, err)) return -1;
        }
        fsdp_pieces swap = *pieces;
        *pieces = *out;
        *out = swap;
    }
    return 0;
}
