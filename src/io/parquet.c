/* The row reader of parquet.h: one cursor per column, each walking its column chunk's pages. */
#include "parquet.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/files.h"
#include "parquet_meta.h"
#include "parquet_page.h"

enum { MAX_COLUMNS = 4, FIRST_HEADER_READ = 1 << 14 };

typedef struct {
    const char *name;
    int present, leaf, max_def;
    fsdp_pq_chunk chunk;
    uint64_t next, end;       /* the next page header, the chunk's end */
    /* the chunk's dictionary */
    uint8_t *dict;            /* its decompressed bytes */
    const uint8_t **dict_s;
    uint32_t *dict_len, dict_n;
    /* the current data page */
    uint8_t *raw, *page;      /* as read, and decompressed */
    size_t raw_cap, page_cap;
    int64_t page_left;        /* values left in the page */
    fsdp_pq_rle defs;
    int dictionary;           /* its values are dictionary indices */
    fsdp_pq_rle indices;
    const uint8_t *vp, *vend; /* PLAIN values */
} column;

struct fsdp_parquet {
    char path[4096];
    int fd;
    uint64_t size, bytes;
    size_t max_bytes;
    fsdp_pq_meta meta;
    column cols[MAX_COLUMNS];
    int num_cols;
    int group;                /* the row group being read (-1 before the first) */
    int64_t group_left, row;
};

static const char *type_name(int type) {
    static const char *const NAMES[] = {"BOOLEAN", "INT32", "INT64", "INT96", "FLOAT", "DOUBLE", "BYTE_ARRAY",
                                        "FIXED_LEN_BYTE_ARRAY"};
    return type >= 0 && type < 8 ? NAMES[type] : "of an unknown type";
}

static const char *encoding_name(int e) {
    static const char *const NAMES[] = {"PLAIN", "GROUP_VAR_INT", "PLAIN_DICTIONARY", "RLE", "BIT_PACKED",
                                        "DELTA_BINARY_PACKED", "DELTA_LENGTH_BYTE_ARRAY", "DELTA_BYTE_ARRAY",
                                        "RLE_DICTIONARY", "BYTE_STREAM_SPLIT"};
    return e >= 0 && e < 10 ? NAMES[e] : "unknown";
}

/* "FILE: row group G, column "NAME": " then the message. */
static int col_err(const fsdp_parquet *p, const column *c, fsdp_err *err, const char *what) {
    return fsdp_errf(err, "%s: row group %d, column \"%s\": %s", p->path, p->group + 1, c->name, what);
}

static int read_at(fsdp_parquet *p, const column *c, void *buf, size_t n, uint64_t at, fsdp_err *err) {
    size_t done = 0;
    while (done < n) {
        ssize_t got = pread(p->fd, (char *)buf + done, n - done, (off_t)(at + done));
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return fsdp_errf(err, "%s: pread at byte %llu: %s", p->path, (unsigned long long)(at + done),
                                      strerror(errno));
        if (got == 0) return col_err(p, c, err, "the file ends inside the column's pages (truncated)");
        done += (size_t)got;
    }
    return 0;
}

static void reserve(uint8_t **buf, size_t *cap, size_t n) {
    if (n <= *cap && *buf) return;
    free(*buf);
    *buf = fsdp_xmalloc(n ? n : 1, "a Parquet page");
    *cap = n;
}

/* Reads the page header at c->next. */
static int read_header(fsdp_parquet *p, column *c, fsdp_pq_page *h, fsdp_err *err) {
    uint64_t left = c->end - c->next;
    size_t n = left < FIRST_HEADER_READ ? (size_t)left : FIRST_HEADER_READ;
    for (;;) {
        reserve(&c->raw, &c->raw_cap, n);
        if (read_at(p, c, c->raw, n, c->next, err)) return -1;
        int rc = fsdp_pq_page_header(c->raw, n, h);
        if (rc < 0 || (rc == 0 && n == left)) return col_err(p, c, err, "a malformed page header");
        if (rc > 0) break;
        if (n >= p->max_bytes)
            return col_err(p, c, err, "a page header larger than --max-memory allows for one document (raise it)");
        n = 2 * n < left ? 2 * n : (size_t)left;
    }
    if (h->compressed > (int64_t)(left - h->header_len))
        return col_err(p, c, err, "a page that runs past the column chunk's end (truncated or malformed)");
    if ((uint64_t)h->compressed > p->max_bytes || (uint64_t)h->uncompressed > p->max_bytes) {
        char msg[200];
        snprintf(msg, sizeof msg,
                 "a page of %.1f MiB, more than the %.1f MiB --max-memory allows for one document (raise --max-memory)",
                 (double)(h->compressed > h->uncompressed ? h->compressed : h->uncompressed) / 1048576.0,
                 (double)p->max_bytes / 1048576.0);
        return col_err(p, c, err, msg);
    }
    return 0;
}

/* Reads the page body (c->raw) and decompresses bytes [skip, compressed) of it into c->page. */
static int read_body(fsdp_parquet *p, column *c, const fsdp_pq_page *h, size_t skip, int compressed, size_t *len,
                     fsdp_err *err) {
    uint64_t at = c->next + h->header_len;
    reserve(&c->raw, &c->raw_cap, (size_t)h->compressed);
    if (read_at(p, c, c->raw, (size_t)h->compressed, at, err)) return -1;
    p->bytes += h->header_len + (uint64_t)h->compressed;
    c->next = at + (uint64_t)h->compressed;
    if (skip > (size_t)h->compressed || skip > (size_t)h->uncompressed)
        return col_err(p, c, err, "a page whose levels are longer than the page");
    size_t want = (size_t)h->uncompressed - skip;
    reserve(&c->page, &c->page_cap, want);
    const char *why = fsdp_pq_decompress(compressed ? c->chunk.codec : PQ_UNCOMPRESSED, c->raw + skip,
                                         (size_t)h->compressed - skip, c->page, want);
    if (why) {
        char msg[300];
        snprintf(msg, sizeof msg, "a %s page that does not decompress: %s",
                 fsdp_pq_codec_name(compressed ? c->chunk.codec : 0), why);
        return col_err(p, c, err, msg);
    }
    *len = want;
    return 0;
}

static int load_dictionary(fsdp_parquet *p, column *c, const fsdp_pq_page *h, fsdp_err *err) {
    if (c->dict) return col_err(p, c, err, "a second dictionary page in one column chunk");
    if (h->encoding != PQ_PLAIN && h->encoding != PQ_PLAIN_DICTIONARY)
        return col_err(p, c, err, "a dictionary page not PLAIN-encoded");
    size_t len;
    if (read_body(p, c, h, 0, 1, &len, err)) return -1;
    if ((uint64_t)h->num_values > len / 4) return col_err(p, c, err, "a dictionary of more values than its bytes hold");
    /* the dictionary stays for the whole chunk: it takes the page buffer, and the next page gets a new one */
    c->dict = c->page, c->page = NULL, c->page_cap = 0;
    c->dict_n = (uint32_t)h->num_values;
    c->dict_s = fsdp_xcalloc(c->dict_n + 1, sizeof *c->dict_s, "a Parquet dictionary");
    c->dict_len = fsdp_xcalloc(c->dict_n + 1, sizeof *c->dict_len, "a Parquet dictionary");
    const uint8_t *q = c->dict, *end = c->dict + len;
    for (uint32_t i = 0; i < c->dict_n; i++) {
        size_t n;
        if (!fsdp_pq_plain_next(&q, end, &c->dict_s[i], &n)) return col_err(p, c, err, "a malformed dictionary page");
        c->dict_len[i] = (uint32_t)n;
    }
    return 0;
}

/* Reads pages until a data page with values is loaded. */
static int load_page(fsdp_parquet *p, column *c, fsdp_err *err) {
    for (;;) {
        if (c->next >= c->end) return col_err(p, c, err, "its pages end before the row group's rows (malformed)");
        fsdp_pq_page h;
        if (read_header(p, c, &h, err)) return -1;
        if (h.type == PQ_DICTIONARY_PAGE) {
            if (load_dictionary(p, c, &h, err)) return -1;
            continue;
        }
        if (h.type != PQ_DATA_PAGE && h.type != PQ_DATA_PAGE_V2) {
            p->bytes += h.header_len + (uint64_t)h.compressed; /* an index page: nothing prepare reads */
            c->next += h.header_len + (uint64_t)h.compressed;
            continue;
        }
        int v2 = h.type == PQ_DATA_PAGE_V2;
        size_t levels = v2 ? (size_t)(h.def_len + h.rep_len) : 0, len;
        if (v2 && h.rep_len) return col_err(p, c, err, "repetition levels in a flat column (malformed)");
        if (read_body(p, c, &h, levels, !v2 || h.is_compressed, &len, err)) return -1;
        const uint8_t *v = c->page, *end = c->page + len;
        if (c->max_def && v2) {
            fsdp_pq_rle_init(&c->defs, c->raw, (size_t)h.def_len, 1);
        } else if (c->max_def) {
            if (h.def_encoding != PQ_RLE) {
                char msg[160];
                snprintf(msg, sizeof msg, "definition levels encoded %s (only RLE is read)",
                         encoding_name(h.def_encoding));
                return col_err(p, c, err, msg);
            }
            if (len < 4) return col_err(p, c, err, "a page too short for its definition levels (malformed)");
            uint32_t n = (uint32_t)v[0] | (uint32_t)v[1] << 8 | (uint32_t)v[2] << 16 | (uint32_t)v[3] << 24;
            if (n > len - 4) return col_err(p, c, err, "definition levels longer than their page (malformed)");
            fsdp_pq_rle_init(&c->defs, v + 4, n, 1);
            v += 4 + n;
        }
        if (h.encoding == PQ_PLAIN) {
            c->dictionary = 0, c->vp = v, c->vend = end;
        } else if (h.encoding == PQ_PLAIN_DICTIONARY || h.encoding == PQ_RLE_DICTIONARY) {
            if (!c->dict) return col_err(p, c, err, "dictionary-encoded values without a dictionary page");
            if (v >= end || *v > 32) return col_err(p, c, err, "malformed dictionary indices");
            c->dictionary = 1;
            fsdp_pq_rle_init(&c->indices, v + 1, (size_t)(end - v - 1), *v);
        } else {
            char msg[200];
            snprintf(msg, sizeof msg, "values encoded %s, which fsdp.c does not read (it reads PLAIN, PLAIN_DICTIONARY "
                                      "and RLE_DICTIONARY)", encoding_name(h.encoding));
            return col_err(p, c, err, msg);
        }
        c->page_left = h.num_values;
        if (c->page_left > 0) return 0;
    }
}

static int column_next(fsdp_parquet *p, column *c, fsdp_pq_value *v, fsdp_err *err) {
    memset(v, 0, sizeof *v);
    v->s = "";
    if (!c->present) {
        v->null = 1;
        return 0;
    }
    while (c->page_left == 0)
        if (load_page(p, c, err)) return -1;
    c->page_left--;
    uint32_t def = (uint32_t)c->max_def;
    if (c->max_def && !fsdp_pq_rle_next(&c->defs, &def)) return col_err(p, c, err, "malformed definition levels");
    if (def != (uint32_t)c->max_def) {
        if (def > (uint32_t)c->max_def) return col_err(p, c, err, "malformed definition levels");
        v->null = 1;
        return 0;
    }
    if (c->dictionary) {
        uint32_t i;
        if (!fsdp_pq_rle_next(&c->indices, &i) || i >= c->dict_n)
            return col_err(p, c, err, "a dictionary index out of its dictionary (malformed)");
        v->s = (const char *)c->dict_s[i], v->len = c->dict_len[i];
        return 0;
    }
    const uint8_t *s;
    if (!fsdp_pq_plain_next(&c->vp, c->vend, &s, &v->len)) return col_err(p, c, err, "a value past its page's end");
    v->s = (const char *)s;
    return 0;
}

static void column_reset(column *c) {
    free(c->dict);
    free(c->dict_s);
    free(c->dict_len);
    c->dict = NULL, c->dict_s = NULL, c->dict_len = NULL, c->dict_n = 0;
    c->page_left = 0;
}

/* Starts row group g: checks each column's chunk. */
static int start_group(fsdp_parquet *p, int g, fsdp_err *err) {
    p->group = g;
    p->group_left = -1;
    for (int i = 0; i < p->num_cols; i++) {
        column *c = &p->cols[i];
        column_reset(c);
        if (!c->present) continue;
        int64_t rows;
        if (fsdp_pq_row_group(&p->meta, g, c->leaf, &rows, &c->chunk, p->path, err)) return -1;
        p->group_left = rows;
        char msg[300];
        if (c->chunk.external) return col_err(p, c, err, "its data is in another file (file_path; not supported)");
        if (!fsdp_pq_codec_supported(c->chunk.codec)) {
            const char *name = fsdp_pq_codec_name(c->chunk.codec);
            snprintf(msg, sizeof msg,
                     "compressed with %s%s, which fsdp.c does not read (it reads UNCOMPRESSED, SNAPPY, GZIP and ZSTD)",
                     name ? name : "an unknown codec", name ? "" : " (not in parquet.thrift)");
            return col_err(p, c, err, msg);
        }
        if (c->chunk.num_values != rows)
            return col_err(p, c, err, "a value count other than its row count (malformed)");
        if (c->chunk.start < 4 || (uint64_t)c->chunk.start + (uint64_t)c->chunk.size > p->size - 8)
            return col_err(p, c, err, "a column chunk outside the file (truncated or malformed)");
        c->next = (uint64_t)c->chunk.start, c->end = c->next + (uint64_t)c->chunk.size;
    }
    return 0;
}

int fsdp_parquet_next(fsdp_parquet *p, fsdp_pq_value *values, fsdp_err *err) {
    while (p->group_left <= 0) {
        if (p->group + 1 >= p->meta.num_row_groups) return 0;
        if (start_group(p, p->group + 1, err)) return -1;
    }
    for (int i = 0; i < p->num_cols; i++)
        if (column_next(p, &p->cols[i], &values[i], err)) return -1;
    p->group_left--;
    p->row++;
    return 1;
}

int64_t fsdp_parquet_row(const fsdp_parquet *p) { return p->row; }
uint64_t fsdp_parquet_bytes(const fsdp_parquet *p) { return p->bytes; }

/* Finds column `name` among the top-level fields and checks it holds UTF-8 strings. */
static int find_column(fsdp_parquet *p, column *c, const char *name, int optional, const char *flag, fsdp_err *err) {
    const fsdp_pq_field *f = NULL;
    for (int i = 0; i < p->meta.num_fields && !f; i++)
        if (p->meta.fields[i].name_len == strlen(name) && !memcmp(p->meta.fields[i].name, name, strlen(name)))
            f = &p->meta.fields[i];
    c->name = name;
    if (!f) {
        if (optional) return 0;
        char names[700];
        fsdp_pq_field_names(&p->meta, names, sizeof names);
        return fsdp_errf(err, "%s: no column \"%s\"%s; its columns: %s", p->path, name, flag, names);
    }
    if (f->is_group)
        return fsdp_errf(err, "%s: column \"%s\" is a group (a list, map or struct), not a column of strings", p->path,
                         name);
    if (f->repetition == PQ_REPEATED)
        return fsdp_errf(err, "%s: column \"%s\" is repeated (a list), not a column of strings", p->path, name);
    if (f->type != PQ_BYTE_ARRAY)
        return fsdp_errf(err, "%s: column \"%s\" is %s, not text (BYTE_ARRAY annotated as UTF-8)", p->path, name,
                         type_name(f->type));
    if (!f->utf8)
        return fsdp_errf(err, "%s: column \"%s\" is binary BYTE_ARRAY, not text (no UTF8 or STRING annotation)",
                         p->path, name);
    c->present = 1, c->leaf = f->leaf, c->max_def = f->repetition == PQ_OPTIONAL;
    return 0;
}

fsdp_parquet *fsdp_parquet_open(const char *path, const char *const *columns, const int *optional, int num_columns,
                                const char *flag, size_t max_bytes, fsdp_err *err) {
    FSDP_ASSERT(num_columns > 0 && num_columns <= MAX_COLUMNS);
    int fd = fsdp_open_regular(path, O_RDONLY, 0, NULL, err);
    if (fd < 0) return NULL;
    fsdp_parquet *p = fsdp_xcalloc(1, sizeof *p, "a Parquet reader");
    snprintf(p->path, sizeof p->path, "%s", path);
    p->fd = fd, p->max_bytes = max_bytes, p->group = -1, p->num_cols = num_columns;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        fsdp_errf(err, "%s: fstat: %s", path, strerror(errno));
        fsdp_parquet_close(p);
        return NULL;
    }
    p->size = (uint64_t)st.st_size;
    if (fsdp_pq_meta_read(fd, path, p->size, max_bytes, &p->meta, err)) {
        fsdp_parquet_close(p);
        return NULL;
    }
    p->bytes = p->meta.footer_len + 12;
    for (int i = 0; i < num_columns; i++)
        if (find_column(p, &p->cols[i], columns[i], optional && optional[i], flag, err)) {
            fsdp_parquet_close(p);
            return NULL;
        }
    return p;
}

void fsdp_parquet_close(fsdp_parquet *p) {
    if (!p) return;
    for (int i = 0; i < MAX_COLUMNS; i++) {
        column_reset(&p->cols[i]);
        free(p->cols[i].raw);
        free(p->cols[i].page);
    }
    fsdp_pq_meta_free(&p->meta);
    if (p->fd >= 0) close(p->fd);
    free(p);
}
