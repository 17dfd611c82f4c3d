/* The footer and page headers of parquet_meta.h. Field ids are parquet.thrift's. */
#include "parquet_meta.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "thrift_compact.h"

/* pread of exactly n bytes; -1 with err on an error or a short read. */
static int read_at(int fd, const char *path, void *buf, size_t n, uint64_t at, fsdp_err *err) {
    size_t done = 0;
    while (done < n) {
        ssize_t got = pread(fd, (char *)buf + done, n - done, (off_t)(at + done));
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return fsdp_errf(err, "%s: pread at byte %llu: %s", path, (unsigned long long)(at + done),
                                      strerror(errno));
        if (got == 0) return fsdp_errf(err, "%s: ends at byte %llu, inside its footer (truncated)", path,
                                       (unsigned long long)(at + done));
        done += (size_t)got;
    }
    return 0;
}

/* One SchemaElement (the fields prepare needs; the rest skipped). */
typedef struct {
    const uint8_t *name;
    size_t name_len;
    int type, repetition, num_children, converted, logical;
} element;

static void read_element(fsdp_thrift *t, element *e) {
    memset(e, 0, sizeof *e);
    e->type = e->repetition = e->converted = -1;
    int last = 0, id, type;
    while (!t->bad && fsdp_thrift_field(t, &last, &id, &type)) {
        if (id == 1) e->type = (int)fsdp_thrift_int_of(t, type);
        else if (id == 3) e->repetition = (int)fsdp_thrift_int_of(t, type);
        else if (id == 4 && type == THRIFT_BINARY) e->name = fsdp_thrift_binary(t, &e->name_len);
        else if (id == 5) e->num_children = (int)fsdp_thrift_int_of(t, type);
        else if (id == 6) e->converted = (int)fsdp_thrift_int_of(t, type);
        else if (id == 10 && type == THRIFT_STRUCT) {
            /* LogicalType is a union: the id of its one field says which (1 = STRING) */
            int l = 0, lid, ltype;
            while (!t->bad && fsdp_thrift_field(t, &l, &lid, &ltype)) {
                e->logical = lid;
                fsdp_thrift_skip(t, ltype);
            }
        } else fsdp_thrift_skip(t, type);
    }
}

/* The schema list: its top-level fields, with their first leaf's index. */
static int read_schema(fsdp_thrift *t, fsdp_pq_meta *m, const char *path, fsdp_err *err) {
    int elem_type;
    size_t n = fsdp_thrift_list(t, &elem_type);
    if (t->bad || elem_type != THRIFT_STRUCT || n == 0)
        return fsdp_errf(err, "%s: malformed footer (its schema)", path);
    element *e = fsdp_xcalloc(n, sizeof *e, "a Parquet schema");
    for (size_t i = 0; i < n && !t->bad; i++) read_element(t, &e[i]);
    int rc = 0;
    if (t->bad || e[0].num_children < 0 || (size_t)e[0].num_children > n) {
        rc = fsdp_errf(err, "%s: malformed footer (its schema)", path);
    } else {
        m->fields = fsdp_xcalloc((size_t)e[0].num_children + 1, sizeof *m->fields, "Parquet fields");
        size_t i = 1;
        for (int f = 0; f < e[0].num_children && rc == 0; f++) {
            if (i >= n) {
                rc = fsdp_errf(err, "%s: malformed footer (a schema of fewer elements than its groups claim)", path);
                break;
            }
            fsdp_pq_field *x = &m->fields[m->num_fields++];
            x->name = (const char *)e[i].name, x->name_len = e[i].name_len;
            x->is_group = e[i].num_children > 0;
            x->type = x->is_group ? -1 : e[i].type;
            x->repetition = e[i].repetition;
            x->utf8 = e[i].converted == PQ_CONVERTED_UTF8 || e[i].logical == 1;
            x->leaf = m->num_leaves;
            /* walk the field's subtree: its leaves come next in the leaf order */
            for (long pending = 1; pending > 0; i++) {
                if (i >= n || e[i].num_children < 0) {
                    rc = fsdp_errf(err, "%s: malformed footer (a schema of fewer elements than its groups claim)",
                                   path);
                    break;
                }
                pending += e[i].num_children - 1;
                if (e[i].num_children == 0) m->num_leaves++;
            }
        }
    }
    free(e);
    return rc;
}

int fsdp_pq_meta_read(int fd, const char *path, uint64_t size, size_t max_footer, fsdp_pq_meta *m, fsdp_err *err) {
    memset(m, 0, sizeof *m);
    uint8_t head[4], tail[8];
    if (size < 12) return fsdp_errf(err, "%s: not a Parquet file (%llu bytes, too short for one)", path,
                                    (unsigned long long)size);
    if (read_at(fd, path, head, 4, 0, err) || read_at(fd, path, tail, 8, size - 8, err)) return -1;
    if (memcmp(head, "PAR1", 4)) return fsdp_errf(err, "%s: not a Parquet file (no PAR1 magic at its start)", path);
    if (!memcmp(tail + 4, "PARE", 4)) return fsdp_errf(err, "%s: an encrypted Parquet file (not supported)", path);
    if (memcmp(tail + 4, "PAR1", 4))
        return fsdp_errf(err, "%s: no PAR1 magic at its end: a truncated or unfinished Parquet file", path);
    uint64_t len = (uint64_t)tail[0] | (uint64_t)tail[1] << 8 | (uint64_t)tail[2] << 16 | (uint64_t)tail[3] << 24;
    if (len == 0 || len > size - 12)
        return fsdp_errf(err, "%s: truncated footer (it claims %llu bytes, the file holds %llu before its end)", path,
                         (unsigned long long)len, (unsigned long long)(size - 12));
    if (len > max_footer)
        return fsdp_errf(err, "%s: a footer of %.1f MiB, more than the %.1f MiB --max-memory allows for one document "
                              "(raise --max-memory)",
                         path, (double)len / 1048576.0, (double)max_footer / 1048576.0);
    m->footer = fsdp_xmalloc(len, "a Parquet footer");
    m->footer_len = len;
    if (read_at(fd, path, m->footer, len, size - 8 - len, err)) return -1;
    fsdp_thrift t = {m->footer, m->footer + len, 0};
    int last = 0, id, type, have_schema = 0;
    while (!t.bad && fsdp_thrift_field(&t, &last, &id, &type)) {
        if (id == 2 && type == THRIFT_LIST && !have_schema) {
            if (read_schema(&t, m, path, err)) return -1;
            have_schema = 1;
        } else if (id == 3) {
            m->num_rows = fsdp_thrift_int_of(&t, type);
        } else if (id == 4 && type == THRIFT_LIST && !m->row_groups) {
            int elem;
            size_t n = fsdp_thrift_list(&t, &elem);
            if (elem != THRIFT_STRUCT && n) t.bad = 1;
            m->row_groups = fsdp_xcalloc(n + 1, sizeof *m->row_groups, "Parquet row groups");
            for (size_t g = 0; g < n && !t.bad; g++) {
                m->row_groups[m->num_row_groups++] = t.p;
                fsdp_thrift_skip(&t, THRIFT_STRUCT);
            }
        } else {
            fsdp_thrift_skip(&t, type);
        }
    }
    if (t.bad || !have_schema) return fsdp_errf(err, "%s: malformed footer (not Parquet's FileMetaData)", path);
    return 0;
}

void fsdp_pq_meta_free(fsdp_pq_meta *m) {
    free(m->footer);
    free(m->fields);
    free(m->row_groups);
    memset(m, 0, sizeof *m);
}

void fsdp_pq_field_names(const fsdp_pq_meta *m, char *buf, size_t cap) {
    size_t at = 0;
    buf[0] = 0;
    for (int f = 0; f < m->num_fields && at + 1 < cap; f++) {
        int n = snprintf(buf + at, cap - at, "%s\"%.*s\"", f ? ", " : "", (int)m->fields[f].name_len,
                         m->fields[f].name);
        if (n < 0) break;
        at += (size_t)n;
    }
    if (m->num_fields == 0) snprintf(buf, cap, "none");
}

static void read_column_meta(fsdp_thrift *t, fsdp_pq_chunk *c, int64_t *data, int64_t *dict) {
    int last = 0, id, type;
    while (!t->bad && fsdp_thrift_field(t, &last, &id, &type)) {
        if (id == 1) c->type = (int)fsdp_thrift_int_of(t, type);
        else if (id == 4) c->codec = (int)fsdp_thrift_int_of(t, type);
        else if (id == 5) c->num_values = fsdp_thrift_int_of(t, type);
        else if (id == 7) c->size = fsdp_thrift_int_of(t, type);
        else if (id == 9) *data = fsdp_thrift_int_of(t, type);
        else if (id == 11) *dict = fsdp_thrift_int_of(t, type);
        else fsdp_thrift_skip(t, type);
    }
}

int fsdp_pq_row_group(const fsdp_pq_meta *m, int g, int leaf, int64_t *rows, fsdp_pq_chunk *c, const char *path,
                      fsdp_err *err) {
    fsdp_thrift t = {m->row_groups[g], m->footer + m->footer_len, 0};
    memset(c, 0, sizeof *c);
    *rows = -1;
    int last = 0, id, type, found = 0;
    int64_t data = -1, dict = -1;
    while (!t.bad && fsdp_thrift_field(&t, &last, &id, &type)) {
        if (id == 1 && type == THRIFT_LIST) {
            int elem;
            size_t n = fsdp_thrift_list(&t, &elem);
            for (size_t k = 0; k < n && !t.bad; k++) {
                if (k != (size_t)leaf) {
                    fsdp_thrift_skip(&t, THRIFT_STRUCT);
                    continue;
                }
                found = 1;
                int l = 0, cid, ctype;
                while (!t.bad && fsdp_thrift_field(&t, &l, &cid, &ctype)) {
                    if (cid == 1) c->external = 1;
                    if (cid == 3 && ctype == THRIFT_STRUCT) read_column_meta(&t, c, &data, &dict);
                    else fsdp_thrift_skip(&t, ctype);
                }
            }
        } else if (id == 3) {
            *rows = fsdp_thrift_int_of(&t, type);
        } else {
            fsdp_thrift_skip(&t, type);
        }
    }
    /* Some writers put 0 where no dictionary page is; a dictionary page comes before the data pages. */
    c->start = dict > 0 && dict < data ? dict : data;
    if (t.bad || !found || *rows < 0 || data < 4 || c->size < 0 || c->num_values < 0)
        return fsdp_errf(err, "%s: malformed footer (row group %d, column %d)", path, g + 1, leaf + 1);
    return 0;
}

/* DataPageHeader (kind 0), DataPageHeaderV2 (2) or DictionaryPageHeader (1, whose field 3 is a bool). */
static void read_data_header(fsdp_thrift *t, fsdp_pq_page *h, int kind) {
    int last = 0, id, type, v2 = kind == 2;
    while (!t->bad && fsdp_thrift_field(t, &last, &id, &type)) {
        if (id == 1) h->num_values = fsdp_thrift_int_of(t, type);
        else if (!v2 && id == 2) h->encoding = (int)fsdp_thrift_int_of(t, type);
        else if (kind == 0 && id == 3) h->def_encoding = (int)fsdp_thrift_int_of(t, type);
        else if (v2 && id == 4) h->encoding = (int)fsdp_thrift_int_of(t, type);
        else if (v2 && id == 5) h->def_len = fsdp_thrift_int_of(t, type);
        else if (v2 && id == 6) h->rep_len = fsdp_thrift_int_of(t, type);
        else if (v2 && id == 7 && (type == THRIFT_TRUE || type == THRIFT_FALSE)) h->is_compressed = type == THRIFT_TRUE;
        else fsdp_thrift_skip(t, type);
    }
}

int fsdp_pq_page_header(const uint8_t *buf, size_t n, fsdp_pq_page *h) {
    memset(h, 0, sizeof *h);
    h->type = -1, h->encoding = -1, h->def_encoding = PQ_RLE, h->is_compressed = 1;
    fsdp_thrift t = {buf, buf + n, 0};
    int last = 0, id, type;
    while (!t.bad && fsdp_thrift_field(&t, &last, &id, &type)) {
        if (id == 1) h->type = (int)fsdp_thrift_int_of(&t, type);
        else if (id == 2) h->uncompressed = fsdp_thrift_int_of(&t, type);
        else if (id == 3) h->compressed = fsdp_thrift_int_of(&t, type);
        else if (id == 5 && type == THRIFT_STRUCT) read_data_header(&t, h, 0);
        else if (id == 7 && type == THRIFT_STRUCT) read_data_header(&t, h, 1);
        else if (id == 8 && type == THRIFT_STRUCT) read_data_header(&t, h, 2);
        else fsdp_thrift_skip(&t, type);
    }
    if (t.bad) return 0; /* cut short, or malformed: the caller reads more until the chunk's end */
    h->header_len = (size_t)(t.p - buf);
    if (h->type < 0 || h->uncompressed < 0 || h->compressed < 0 || h->num_values < 0 || h->def_len < 0 ||
        h->rep_len < 0)
        return -1;
    return 1;
}
