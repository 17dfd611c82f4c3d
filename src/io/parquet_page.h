/* Parquet page contents: decompression (Snappy through libsnappy, gzip through zlib, Zstd through
 * libzstd: Debian's libsnappy-dev, zlib1g-dev, libzstd-dev), the RLE/bit-packed hybrid encoding of
 * definition levels and dictionary indices, and PLAIN BYTE_ARRAY values, all decoded as streams (a
 * page is never expanded into an array of values, so a page of a million nulls costs nothing). The
 * decoders are hand-written for the reason io/parquet_meta.h gives.
 *
 * Promises: nothing is read outside the buffers given; a malformed run, a value past its page, or a
 * decompressed size other than the page header's is an error, never a guess. */
#ifndef FSDP_IO_PARQUET_PAGE_H
#define FSDP_IO_PARQUET_PAGE_H

#include <stddef.h>
#include <stdint.h>

/* Decompresses src[0..n) into dst, which must come out exactly `want` bytes. NULL on success, else
 * why not (a static string). */
const char *fsdp_pq_decompress(int codec, const uint8_t *src, size_t n, uint8_t *dst, size_t want);
/* The codec's name as parquet.thrift spells it ("SNAPPY"), or NULL for an unknown number. */
const char *fsdp_pq_codec_name(int codec);
/* 1 for the codecs decompress supports. */
int fsdp_pq_codec_supported(int codec);

/* The RLE/bit-packed hybrid decoder (values of `width` bits, 0..32). */
typedef struct {
    const uint8_t *p, *end;
    int width;
    uint32_t left;      /* values left in the current run */
    int packed;         /* the run is bit-packed */
    uint32_t value;     /* an RLE run's value */
    const uint8_t *bits; /* a bit-packed run's bytes */
    uint64_t bit;       /* the next value's first bit in them */
} fsdp_pq_rle;

void fsdp_pq_rle_init(fsdp_pq_rle *d, const uint8_t *p, size_t n, int width);
/* 1 and the next value, 0 when the runs are exhausted or malformed. */
int fsdp_pq_rle_next(fsdp_pq_rle *d, uint32_t *v);

/* The next PLAIN BYTE_ARRAY value at *p (a 4-byte little-endian length, then the bytes): 1 and the
 * value, advancing *p; 0 when it runs past end. */
int fsdp_pq_plain_next(const uint8_t **p, const uint8_t *end, const uint8_t **s, size_t *len);

/* Bits needed for values up to max (0 for 0). */
int fsdp_pq_bit_width(uint32_t max);

#endif
