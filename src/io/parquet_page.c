/* The page decoders of parquet_page.h. */
#include "parquet_page.h"

#include <snappy-c.h>
#include <string.h>
#include <zlib.h>
#include <zstd.h>

#include "parquet_meta.h"

const char *fsdp_pq_codec_name(int codec) {
    static const char *const NAMES[] = {"UNCOMPRESSED", "SNAPPY", "GZIP", "LZO", "BROTLI", "LZ4", "ZSTD", "LZ4_RAW"};
    return codec >= 0 && codec < (int)(sizeof NAMES / sizeof NAMES[0]) ? NAMES[codec] : NULL;
}

int fsdp_pq_codec_supported(int codec) {
    return codec == PQ_UNCOMPRESSED || codec == PQ_SNAPPY || codec == PQ_GZIP || codec == PQ_ZSTD;
}

/* gzip: one or more members (a writer may concatenate them), each inflated in turn. */
static const char *gunzip(const uint8_t *src, size_t n, uint8_t *dst, size_t want) {
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit2(&z, 15 + 32) != Z_OK) return "zlib's inflateInit2 failed";
    z.next_in = (Bytef *)src, z.avail_in = (uInt)n;
    z.next_out = dst, z.avail_out = (uInt)want;
    const char *why = NULL;
    for (;;) {
        int rc = inflate(&z, Z_FINISH);
        if (rc == Z_STREAM_END) {
            if (z.avail_in == 0) break;
            if (inflateReset(&z) != Z_OK) {
                why = "zlib's inflateReset failed";
                break;
            }
            continue;
        }
        why = rc == Z_BUF_ERROR && z.avail_out == 0 ? "decompresses to more bytes than its header says"
                                                     : "corrupt gzip data";
        break;
    }
    if (!why && z.avail_out != 0) why = "decompresses to fewer bytes than its header says";
    inflateEnd(&z);
    return why;
}

const char *fsdp_pq_decompress(int codec, const uint8_t *src, size_t n, uint8_t *dst, size_t want) {
    if ((uint64_t)n > UINT32_MAX || (uint64_t)want > UINT32_MAX) return "a page of 4 GiB or more";
    switch (codec) {
    case PQ_UNCOMPRESSED:
        if (n != want) return "uncompressed, yet its two sizes differ";
        memcpy(dst, src, n);
        return NULL;
    case PQ_SNAPPY: {
        size_t len;
        if (snappy_uncompressed_length((const char *)src, n, &len) != SNAPPY_OK) return "corrupt Snappy data";
        if (len != want) return "decompresses to another size than its header says";
        if (snappy_uncompress((const char *)src, n, (char *)dst, &len) != SNAPPY_OK || len != want)
            return "corrupt Snappy data";
        return NULL;
    }
    case PQ_GZIP:
        return gunzip(src, n, dst, want);
    case PQ_ZSTD: {
        size_t got = ZSTD_decompress(dst, want, src, n);
        if (ZSTD_isError(got)) return ZSTD_getErrorName(got);
        return got == want ? NULL : "decompresses to fewer bytes than its header says";
    }
    default:
        return "an unsupported codec";
    }
}

int fsdp_pq_bit_width(uint32_t max) {
    int w = 0;
    while (max) w++, max >>= 1;
    return w;
}

void fsdp_pq_rle_init(fsdp_pq_rle *d, const uint8_t *p, size_t n, int width) {
    memset(d, 0, sizeof *d);
    d->p = p, d->end = p + n, d->width = width;
}

static int varint(fsdp_pq_rle *d, uint32_t *v) {
    uint64_t x = 0;
    for (int shift = 0; shift < 35; shift += 7) {
        if (d->p >= d->end) return 0;
        uint8_t b = *d->p++;
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            if (x > UINT32_MAX) return 0;
            *v = (uint32_t)x;
            return 1;
        }
    }
    return 0;
}

/* Starts the next run. */
static int next_run(fsdp_pq_rle *d) {
    uint32_t header;
    if (!varint(d, &header)) return 0;
    if (header & 1) {
        /* bit-packed: (header >> 1) groups of 8 values, width bytes per group; a last run cut short
         * keeps the values whose bits are there */
        uint64_t groups = header >> 1, values = groups * 8, bytes = groups * (uint64_t)d->width;
        uint64_t avail = (uint64_t)(d->end - d->p);
        if (bytes > avail) bytes = avail, values = avail * 8 / (uint64_t)d->width;
        if (values == 0 || values > UINT32_MAX) return 0;
        d->packed = 1, d->left = (uint32_t)values, d->bits = d->p, d->bit = 0;
        d->p += bytes;
        return 1;
    }
    uint32_t count = header >> 1, bytes = ((uint32_t)d->width + 7) / 8;
    if (count == 0 || bytes > (uint32_t)(d->end - d->p)) return 0;
    uint32_t v = 0;
    for (uint32_t i = 0; i < bytes; i++) v |= (uint32_t)d->p[i] << (8 * i);
    d->p += bytes;
    d->packed = 0, d->left = count, d->value = v;
    return 1;
}

int fsdp_pq_rle_next(fsdp_pq_rle *d, uint32_t *v) {
    if (d->left == 0 && !next_run(d)) return 0;
    d->left--;
    if (!d->packed) {
        *v = d->value;
        return 1;
    }
    /* values are packed from the least significant bit of the first byte up */
    uint32_t x = 0;
    for (int i = 0; i < d->width; i++, d->bit++)
        x |= (uint32_t)((d->bits[d->bit >> 3] >> (d->bit & 7)) & 1) << i;
    *v = x;
    return 1;
}

int fsdp_pq_plain_next(const uint8_t **p, const uint8_t *end, const uint8_t **s, size_t *len) {
    if (end - *p < 4) return 0;
    const uint8_t *q = *p;
    uint32_t n = (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
    if (n > (size_t)(end - q) - 4) return 0;
    *s = q + 4, *len = n;
    *p = q + 4 + n;
    return 1;
}
