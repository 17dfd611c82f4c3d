/* The compact-protocol reader of thrift_compact.h. */
#include "thrift_compact.h"

static int fail(fsdp_thrift *t) {
    t->bad = 1;
    t->p = t->end;
    return 0;
}

uint64_t fsdp_thrift_varint(fsdp_thrift *t) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (t->p >= t->end) return (uint64_t)fail(t);
        uint8_t b = *t->p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) return v;
    }
    return (uint64_t)fail(t); /* more than ten bytes */
}

static int64_t zigzag(uint64_t v) { return (int64_t)(v >> 1) ^ -(int64_t)(v & 1); }

int64_t fsdp_thrift_i8(fsdp_thrift *t) {
    if (t->p >= t->end) return fail(t);
    return (int8_t)*t->p++;
}

int64_t fsdp_thrift_int(fsdp_thrift *t) { return zigzag(fsdp_thrift_varint(t)); }

int64_t fsdp_thrift_int_of(fsdp_thrift *t, int type) {
    if (type == THRIFT_I8) return fsdp_thrift_i8(t);
    if (type == THRIFT_I16 || type == THRIFT_I32 || type == THRIFT_I64) return fsdp_thrift_int(t);
    fsdp_thrift_skip(t, type);
    return fail(t);
}

int fsdp_thrift_field(fsdp_thrift *t, int *last, int *id, int *type) {
    if (t->p >= t->end) return fail(t);
    uint8_t b = *t->p++;
    if (b == THRIFT_STOP) return 0;
    int delta = b >> 4;
    *type = b & 0x0f;
    *id = delta ? *last + delta : (int)fsdp_thrift_int(t);
    *last = *id;
    return !t->bad;
}

const uint8_t *fsdp_thrift_binary(fsdp_thrift *t, size_t *len) {
    uint64_t n = fsdp_thrift_varint(t);
    if (t->bad || n > (uint64_t)(t->end - t->p)) {
        *len = 0;
        fail(t);
        return t->end;
    }
    const uint8_t *s = t->p;
    t->p += n;
    *len = (size_t)n;
    return s;
}

size_t fsdp_thrift_list(fsdp_thrift *t, int *elem_type) {
    if (t->p >= t->end) return (size_t)fail(t);
    uint8_t b = *t->p++;
    *elem_type = b & 0x0f;
    uint64_t n = b >> 4;
    if (n == 15) n = fsdp_thrift_varint(t);
    /* every element takes at least one byte: a count beyond the buffer is malformed */
    if (t->bad || n > (uint64_t)(t->end - t->p)) return (size_t)fail(t);
    return (size_t)n;
}

static void skip(fsdp_thrift *t, int type, int depth);

/* An element of a list, set or map: a bool there is one byte, not part of a field header. */
static void skip_element(fsdp_thrift *t, int type, int depth) {
    if (type == THRIFT_TRUE || type == THRIFT_FALSE) fsdp_thrift_i8(t);
    else skip(t, type, depth);
}

static void skip(fsdp_thrift *t, int type, int depth) {
    if (depth > THRIFT_MAX_DEPTH) {
        fail(t);
        return;
    }
    size_t n;
    int elem, last = 0, id, ftype;
    switch (type) {
    case THRIFT_TRUE:
    case THRIFT_FALSE:
        return; /* a struct field's bool is in its header */
    case THRIFT_I8:
        fsdp_thrift_i8(t);
        return;
    case THRIFT_I16:
    case THRIFT_I32:
    case THRIFT_I64:
        fsdp_thrift_varint(t);
        return;
    case THRIFT_DOUBLE:
        if (t->end - t->p < 8) fail(t);
        else t->p += 8;
        return;
    case THRIFT_BINARY:
        fsdp_thrift_binary(t, &n);
        return;
    case THRIFT_LIST:
    case THRIFT_SET:
        n = fsdp_thrift_list(t, &elem);
        for (size_t i = 0; i < n && !t->bad; i++) skip_element(t, elem, depth + 1);
        return;
    case THRIFT_MAP: {
        uint64_t count = fsdp_thrift_varint(t);
        if (count == 0 || t->bad) return;
        if (count > (uint64_t)(t->end - t->p)) {
            fail(t);
            return;
        }
        int kv = (int)fsdp_thrift_i8(t) & 0xff;
        for (uint64_t i = 0; i < count && !t->bad; i++) {
            skip_element(t, kv >> 4, depth + 1);
            skip_element(t, kv & 0x0f, depth + 1);
        }
        return;
    }
    case THRIFT_STRUCT:
        while (!t->bad && fsdp_thrift_field(t, &last, &id, &ftype)) skip(t, ftype, depth + 1);
        return;
    default:
        fail(t);
    }
}

void fsdp_thrift_skip(fsdp_thrift *t, int type) { skip(t, type, 0); }
