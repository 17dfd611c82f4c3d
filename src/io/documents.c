/* Document readers of documents.h: buffered line reads bounded by the largest document, Jansson for
 * JSON, io/parquet.h for Parquet. */
#include "documents.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/files.h"
#include "../base/utf8.h"
#include "jsonio.h"
#include "parquet.h"

struct fsdp_docs_reader {
    char path[4096];
    FILE *f;
    fsdp_docs_format format;
    const char *field;
    size_t max_document;
    long line;       /* lines read so far */
    uint64_t bytes;  /* bytes read so far */
    char *buf;       /* the current line */
    size_t cap;
    char *in;        /* bytes read ahead of the line being assembled */
    size_t in_pos, in_len;
    char *doc;       /* the document being assembled (text formats) */
    size_t doc_len, doc_cap;
    json_t *record;  /* the current JSON record (jsonl, alpaca) */
    json_t *array;   /* alpaca as a JSON array */
    size_t next_record;
    long documents;
    int at_end;
    fsdp_parquet *parquet; /* parquet, or alpaca from a Parquet file */
    uint64_t nulls;
};

int fsdp_docs_check_path(const char *path, fsdp_err *err) {
    struct stat st;
    if (stat(path, &st) != 0) return fsdp_errf(err, "%s: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) return fsdp_errf(err, "%s: is a directory (give the files in it)", path);
    if (!S_ISREG(st.st_mode))
        return fsdp_errf(err, "%s: not a regular file (a FIFO, device or socket is refused: it could block or never end)",
                         path);
    return 0;
}

static const char *const ALPACA_COLUMNS[] = {"instruction", "input", "output"};

/* Parquet: --field's column, or Alpaca's three (input may be absent). */
static fsdp_docs_reader *open_parquet(fsdp_docs_reader *r, fsdp_err *err) {
    static const int ALPACA_OPTIONAL[] = {0, 1, 0};
    if (r->format == FSDP_DOCS_PARQUET)
        r->parquet = fsdp_parquet_open(r->path, &r->field, NULL, 1, " (--field)", r->max_document, err);
    else
        r->parquet = fsdp_parquet_open(r->path, ALPACA_COLUMNS, ALPACA_OPTIONAL, 3, " (Alpaca's records need "
                                       "instruction and output)", r->max_document, err);
    if (!r->parquet) {
        fsdp_docs_close(r);
        return NULL;
    }
    return r;
}

fsdp_docs_reader *fsdp_docs_open(const char *path, fsdp_docs_format format, const char *field, size_t max_document,
                                 fsdp_err *err) {
    if (fsdp_docs_check_path(path, err)) return NULL;
    /* The path may have become a FIFO since the check: open it without blocking, then look again. */
    FILE *f = fsdp_fopen_regular(path, NULL, err);
    if (!f) return NULL;
    fsdp_docs_reader *r = fsdp_xcalloc(1, sizeof *r, "document reader");
    snprintf(r->path, sizeof r->path, "%s", path);
    r->f = f, r->format = format, r->field = field, r->max_document = max_document;
    char magic[4] = {0};
    if (format == FSDP_DOCS_PARQUET || (format == FSDP_DOCS_ALPACA && fread(magic, 1, 4, f) == 4 &&
                                        !memcmp(magic, "PAR1", 4)))
        return open_parquet(r, err);
    if (format != FSDP_DOCS_ALPACA) return r;
    /* Alpaca: a JSON array when the first non-blank byte is '[', else JSON Lines */
    rewind(f);
    int c;
    while ((c = fgetc(f)) == ' ' || c == '\t' || c == '\n' || c == '\r') {}
    if (c != '[') {
        rewind(f);
        return r;
    }
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && (uint64_t)st.st_size > max_document) {
        fsdp_errf(err, "%s: a JSON array of %.1f MiB is read whole, more than the %.1f MiB --max-memory allows for one "
                       "document; write it as JSON Lines (one record per line) to stream it",
                  path, (double)st.st_size / 1048576.0, (double)max_document / 1048576.0);
        fsdp_docs_close(r);
        return NULL;
    }
    r->array = fsdp_json_load_path(path, err);
    if (!r->array) {
        fsdp_docs_close(r);
        return NULL;
    }
    if (!json_is_array(r->array)) {
        fsdp_errf(err, "%s: not a JSON array of records", path);
        fsdp_docs_close(r);
        return NULL;
    }
    r->bytes = (uint64_t)st.st_size;
    return r;
}

void fsdp_docs_close(fsdp_docs_reader *r) {
    if (!r) return;
    if (r->f) fclose(r->f);
    free(r->buf);
    free(r->in);
    free(r->doc);
    json_decref(r->record);
    json_decref(r->array);
    fsdp_parquet_close(r->parquet);
    free(r);
}

uint64_t fsdp_docs_bytes(const fsdp_docs_reader *r) { return r->parquet ? fsdp_parquet_bytes(r->parquet) : r->bytes; }
uint64_t fsdp_docs_nulls(const fsdp_docs_reader *r) { return r->nulls; }

static int too_big(const fsdp_docs_reader *r, long line, fsdp_err *err);

enum { READ_AHEAD = 1 << 16 };

/* Reads the next line into r->buf (newline kept); 0 at the end of the file. A line longer than one
 * document may be is refused once that much of it is read, never held whole (getline would take a
 * gigabyte without a newline into memory before the bound is checked); the document it belongs to
 * started at line `doc_first` (0: at this line). */
static int read_line(fsdp_docs_reader *r, long doc_first, size_t *len, fsdp_err *err) {
    size_t n = 0;
    for (;;) {
        if (r->in_pos == r->in_len) {
            if (!r->in) r->in = fsdp_xmalloc(READ_AHEAD, "a document reader");
            errno = 0;
            r->in_len = fread(r->in, 1, READ_AHEAD, r->f);
            r->in_pos = 0;
            if (r->in_len == 0) {
                if (ferror(r->f))
                    return fsdp_errf(err, "%s: read error after line %ld: %s", r->path, r->line, strerror(errno));
                break;
            }
        }
        const char *at = r->in + r->in_pos, *newline = memchr(at, '\n', r->in_len - r->in_pos);
        size_t take = newline ? (size_t)(newline - at) + 1 : r->in_len - r->in_pos;
        if (n + take > r->max_document + 1) return too_big(r, doc_first ? doc_first : r->line + 1, err);
        if (n + take + 1 > r->cap) {
            size_t cap = r->cap ? r->cap : 4096;
            while (cap < n + take + 1) cap *= 2;
            r->buf = realloc(r->buf, cap);
            if (!r->buf) fsdp_fatal("out of host memory reading %s", r->path);
            r->cap = cap;
        }
        memcpy(r->buf + n, at, take);
        n += take;
        r->in_pos += take;
        if (newline) break;
    }
    if (n == 0) return 0;
    r->buf[n] = 0;
    r->line++;
    r->bytes += (uint64_t)n;
    *len = n;
    return 1;
}

/* Valid UTF-8 without NUL, or an error naming the line (the first line of s is `line`). */
static int check_text(const fsdp_docs_reader *r, const char *s, size_t n, long line, fsdp_err *err) {
    size_t bad = fsdp_utf8_invalid(s, n);
    const char *nul = memchr(s, 0, bad);
    size_t at = nul ? (size_t)(nul - s) : bad;
    if (at == n) return 0;
    for (size_t i = 0; i < at; i++)
        if (s[i] == '\n') line++;
    return fsdp_errf(err, "%s: line %ld: %s (a binary file?)", r->path, line, nul ? "a NUL byte" : "invalid UTF-8");
}

static int too_big(const fsdp_docs_reader *r, long line, fsdp_err *err) {
    return fsdp_errf(err, "%s: %s %ld: a document of more than %.1f MiB, the most --max-memory allows for one "
                          "document; raise --max-memory or split the document",
                     r->path, r->parquet ? "row" : "line", line, (double)r->max_document / 1048576.0);
}

static void doc_append(fsdp_docs_reader *r, const char *s, size_t n) {
    if (r->doc_len + n + 1 > r->doc_cap) {
        size_t cap = r->doc_cap ? r->doc_cap : 4096;
        while (cap < r->doc_len + n + 1) cap *= 2;
        r->doc = realloc(r->doc, cap);
        if (!r->doc) fsdp_fatal("out of host memory reading %s", r->path);
        r->doc_cap = cap;
    }
    memcpy(r->doc + r->doc_len, s, n);
    r->doc_len += n;
    r->doc[r->doc_len] = 0;
}

static int is_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n') return 0;
    return 1;
}

/* Text documents: the whole file, or the runs of non-blank lines. */
static int next_text(fsdp_docs_reader *r, fsdp_document *d, fsdp_err *err) {
    r->doc_len = 0;
    long first = 0;
    size_t n = 0;
    int rc;
    while ((rc = read_line(r, r->doc_len ? first : 0, &n, err)) > 0) {
        if (check_text(r, r->buf, n, r->line, err)) return -1;
        if (r->format == FSDP_DOCS_TEXT_BLANK_LINES && is_blank(r->buf, n)) {
            if (r->doc_len) break;
            continue;
        }
        if (!r->doc_len) first = r->line;
        if (r->doc_len + n > r->max_document) return too_big(r, first, err);
        doc_append(r, r->buf, n);
    }
    if (rc < 0) return -1;
    if (!r->doc_len) return 0;
    d->text = r->doc, d->len = r->doc_len, d->line = first;
    return 1;
}

/* The members a record has, quoted, for the message of a missing one ("\"content\", \"url\""): a user
 * whose records call the text something else sees at once what to pass to --field. */
static void field_names(const json_t *rec, char *buf, size_t cap) {
    const char *key;
    const json_t *v;
    size_t used = 0;
    buf[0] = '\0';
    json_object_foreach((json_t *)rec, key, v) {
        int n = snprintf(buf + used, cap - used, "%s\"%s\"", used ? ", " : "", key);
        (void)v;
        if (n < 0 || (size_t)n >= cap - used) { /* cut: end with "..." */
            memcpy(buf + cap - 4, "...", 4);
            return;
        }
        used += (size_t)n;
    }
}

/* A string member of a record; `required` 0 accepts absent or null as empty. */
static int string_field(const fsdp_docs_reader *r, const json_t *rec, const char *key, int required, const char *where,
                        const char **s, size_t *n, fsdp_err *err) {
    const json_t *v = json_object_get(rec, key);
    if ((!v || json_is_null(v)) && !required) {
        *s = "", *n = 0;
        return 0;
    }
    if (!v) {
        char names[300];
        field_names(rec, names, sizeof names);
        return fsdp_errf(err, "%s: %s: no field \"%s\" (the record has %s%s)", r->path, where, key,
                         names[0] ? names : "no fields",
                         r->format == FSDP_DOCS_JSONL ? "; --field names the one that holds the text" : "");
    }
    if (!json_is_string(v)) return fsdp_errf(err, "%s: %s: field \"%s\" is not a string", r->path, where, key);
    *s = json_string_value(v), *n = json_string_length(v);
    return 0;
}

/* Fills d from one JSON record (jsonl or alpaca). */
static int from_record(fsdp_docs_reader *r, const json_t *rec, const char *where, fsdp_document *d, fsdp_err *err) {
    if (!json_is_object(rec)) return fsdp_errf(err, "%s: %s: not a JSON object", r->path, where);
    if (r->format == FSDP_DOCS_JSONL) return string_field(r, rec, r->field, 1, where, &d->text, &d->len, err);
    if (string_field(r, rec, "instruction", 1, where, &d->text, &d->len, err) ||
        string_field(r, rec, "input", 0, where, &d->input, &d->input_len, err) ||
        string_field(r, rec, "output", 1, where, &d->output, &d->output_len, err))
        return -1;
    if (d->len + d->input_len + d->output_len > r->max_document) return too_big(r, d->line, err);
    return 0;
}

static int next_record(fsdp_docs_reader *r, fsdp_document *d, fsdp_err *err) {
    char where[64];
    json_decref(r->record);
    r->record = NULL;
    if (r->array) {
        if (r->next_record >= json_array_size(r->array)) return 0;
        d->line = (long)r->next_record + 1;
        snprintf(where, sizeof where, "record %ld of the JSON array", d->line);
        return from_record(r, json_array_get(r->array, r->next_record++), where, d, err) ? -1 : 1;
    }
    size_t n = 0;
    int rc;
    while ((rc = read_line(r, 0, &n, err)) > 0) {
        if (is_blank(r->buf, n)) continue;
        if (n > r->max_document) return too_big(r, r->line, err);
        if (check_text(r, r->buf, n, r->line, err)) return -1;
        snprintf(where, sizeof where, "line %ld", r->line);
        char origin[4200];
        snprintf(origin, sizeof origin, "%s: %s", r->path, where);
        r->record = fsdp_json_load_value(r->buf, n, origin, err);
        if (!r->record) return -1;
        d->line = r->line;
        return from_record(r, r->record, where, d, err) ? -1 : 1;
    }
    return rc;
}

/* A Parquet value: valid UTF-8 without NUL, or an error naming the row and column. */
static int check_value(const fsdp_docs_reader *r, const fsdp_pq_value *v, const char *column, fsdp_err *err) {
    size_t bad = fsdp_utf8_invalid(v->s, v->len);
    const char *nul = memchr(v->s, 0, bad);
    if (bad == v->len && !nul) return 0;
    return fsdp_errf(err, "%s: row %lld, column \"%s\": %s", r->path, (long long)fsdp_parquet_row(r->parquet), column,
                     nul ? "a NUL byte" : "invalid UTF-8");
}

/* The next row of a Parquet file with its text (Alpaca: instruction and output) not null. */
static int next_row(fsdp_docs_reader *r, fsdp_document *d, fsdp_err *err) {
    fsdp_pq_value v[3];
    int alpaca = r->format == FSDP_DOCS_ALPACA, rc;
    while ((rc = fsdp_parquet_next(r->parquet, v, err)) > 0) {
        if (v[0].null || (alpaca && v[2].null)) {
            r->nulls++;
            continue;
        }
        for (int i = 0; i < (alpaca ? 3 : 1); i++)
            if (!v[i].null && check_value(r, &v[i], alpaca ? ALPACA_COLUMNS[i] : r->field, err)) return -1;
        d->line = (long)fsdp_parquet_row(r->parquet);
        d->text = v[0].s, d->len = v[0].len;
        if (alpaca) {
            d->input = v[1].s, d->input_len = v[1].len;
            d->output = v[2].s, d->output_len = v[2].len;
        }
        if (d->len + d->input_len + d->output_len > r->max_document) return too_big(r, d->line, err);
        return 1;
    }
    return rc;
}

int fsdp_docs_next(fsdp_docs_reader *r, fsdp_document *d, fsdp_err *err) {
    for (;;) {
        memset(d, 0, sizeof *d);
        d->input = d->output = "";
        int rc = r->parquet                                                        ? next_row(r, d, err)
                 : r->format == FSDP_DOCS_JSONL || r->format == FSDP_DOCS_ALPACA ? next_record(r, d, err)
                                                                                  : next_text(r, d, err);
        if (rc < 0) return -1;
        if (rc == 0) {
            if (!r->documents)
                return fsdp_errf(err, "%s: no documents (an empty input%s)", r->path,
                                 r->nulls ? ", or every text null" : "");
            return 0;
        }
        /* an empty text is no document (an Alpaca record always is one: its prompt is never empty) */
        if (r->format != FSDP_DOCS_ALPACA && d->len == 0) continue;
        r->documents++;
        return 1;
    }
}
