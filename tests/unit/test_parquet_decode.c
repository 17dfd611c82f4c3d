/* The hand-written decoders and encoders behind Parquet input and TensorBoard output, on bytes built
 * here from the specs: Thrift's compact protocol (fields by delta and by long id, zigzag integers,
 * strings, lists, nested structs skipped whole; truncated buffers and too-deep nesting marked bad, not
 * read past), the RLE/bit-packed hybrid (an RLE run, a bit-packed run LSB first, a last run cut
 * short, exhaustion), PLAIN BYTE_ARRAY values, each codec's round trip through its library (and a
 * size other than the header's refused), a page header decoded (and "more bytes needed" when cut
 * short), and CRC-32C's check value. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <snappy-c.h>
#include <zlib.h>
#include <zstd.h>

#include "../../src/io/parquet_meta.h"
#include "../../src/io/parquet_page.h"
#include "../../src/io/tfevents.h"
#include "../../src/io/thrift_compact.h"
#include "check.h"

static void thrift(void) {
    /* struct { 1: i32 -5; 3: binary "ab"; 20: struct { 1: bool true }; 21: list<i32> [1, -1, 300] } */
    const uint8_t msg[] = {0x15, 0x09, 0x28, 0x02, 'a', 'b', 0x0c, 0x28, 0x11, 0x00,
                           0x19, 0x35, 0x02, 0x01, 0xd8, 0x04, 0x00};
    fsdp_thrift t = {msg, msg + sizeof msg, 0};
    int last = 0, id = 0, type = 0;
    int64_t a = 0;
    const uint8_t *s = NULL;
    size_t n = 0;
    int fields = 0, skipped = 0;
    while (fsdp_thrift_field(&t, &last, &id, &type)) {
        fields++;
        if (id == 1) a = fsdp_thrift_int_of(&t, type);
        else if (id == 3) s = fsdp_thrift_binary(&t, &n);
        else fsdp_thrift_skip(&t, type), skipped++;
    }
    check_that(!t.bad && fields == 4 && skipped == 2 && a == -5 && n == 2 && !memcmp(s, "ab", 2) &&
                   t.p == msg + sizeof msg,
               "thrift: i32 -5, binary \"ab\", a nested struct and a list skipped, to the STOP byte");
    /* the list's elements read one by one */
    fsdp_thrift l = {msg + 11, msg + 16, 0};
    int elem = 0;
    size_t count = fsdp_thrift_list(&l, &elem);
    int64_t x = fsdp_thrift_int(&l), y = fsdp_thrift_int(&l), z = fsdp_thrift_int(&l);
    check_that(count == 3 && elem == THRIFT_I32 && x == 1 && y == -1 && z == 300 && !l.bad,
               "thrift: list<i32> [1, -1, 300]");
    /* every cut of the message is bad or ends early, never read past */
    int cuts_ok = 1;
    for (size_t cut = 0; cut < sizeof msg - 1; cut++) {
        fsdp_thrift c = {msg, msg + cut, 0};
        last = 0;
        while (fsdp_thrift_field(&c, &last, &id, &type)) fsdp_thrift_skip(&c, type);
        cuts_ok &= c.bad && c.p <= msg + cut;
    }
    check_that(cuts_ok, "thrift: each truncation of the message is marked bad");
    /* 40 nested structs: deeper than THRIFT_MAX_DEPTH */
    uint8_t deep[81];
    for (int i = 0; i < 40; i++) deep[2 * i] = 0x1c, deep[2 * i + 1] = 0x1c;
    deep[80] = 0;
    fsdp_thrift d = {deep, deep + sizeof deep, 0};
    fsdp_thrift_skip(&d, THRIFT_STRUCT);
    check_that(d.bad, "thrift: nesting deeper than %d is malformed", THRIFT_MAX_DEPTH);
}

static void rle(void) {
    /* width 3: an RLE run of 5 fours, then one bit-packed group of 0..7, then a cut bit-packed run
     * claiming 2 groups with one byte left (two values of 3 bits fit) */
    const uint8_t bytes[] = {0x0a, 0x04, 0x03, 0x88, 0xc6, 0xfa, 0x05, 0xd1};
    fsdp_pq_rle d;
    fsdp_pq_rle_init(&d, bytes, sizeof bytes, 3);
    uint32_t want[] = {4, 4, 4, 4, 4, 0, 1, 2, 3, 4, 5, 6, 7, 1, 2}, v;
    int ok = 1, n = 0;
    while (fsdp_pq_rle_next(&d, &v)) {
        ok &= n < 15 && v == want[n];
        n++;
    }
    check_that(ok && n == 15, "RLE/bit-packed hybrid: 5 x 4, 0..7 packed LSB first, a last run cut to 2 values (%d)",
               n);
    fsdp_pq_rle_init(&d, bytes, 1, 3);
    check_that(!fsdp_pq_rle_next(&d, &v), "RLE/bit-packed hybrid: a run header without its value is exhausted");
    check_that(fsdp_pq_bit_width(0) == 0 && fsdp_pq_bit_width(1) == 1 && fsdp_pq_bit_width(7) == 3 &&
                   fsdp_pq_bit_width(8) == 4,
               "bit widths of 0, 1, 7, 8");
}

static void plain(void) {
    const uint8_t page[] = {2, 0, 0, 0, 'h', 'i', 0, 0, 0, 0, 5, 0, 0, 0, 'x'};
    const uint8_t *p = page, *s;
    size_t n1, n2, n3;
    int a = fsdp_pq_plain_next(&p, page + sizeof page, &s, &n1);
    int first = a && n1 == 2 && !memcmp(s, "hi", 2);
    int b = fsdp_pq_plain_next(&p, page + sizeof page, &s, &n2);
    int c = fsdp_pq_plain_next(&p, page + sizeof page, &s, &n3);
    check_that(first && b && n2 == 0 && !c, "PLAIN BYTE_ARRAY: \"hi\", \"\", then a length past the page refused");
}

static void codecs(void) {
    char text[3000];
    for (size_t i = 0; i < sizeof text; i++) text[i] = "the quick brown fox "[i % 20];
    uint8_t packed[4096], out[3000];
    size_t n = sizeof packed;
    snappy_compress(text, sizeof text, (char *)packed, &n);
    check_that(!fsdp_pq_decompress(PQ_SNAPPY, packed, n, out, sizeof out) && !memcmp(out, text, sizeof text),
               "SNAPPY page round trip");
    check_that(fsdp_pq_decompress(PQ_SNAPPY, packed, n, out, sizeof out - 1) != NULL,
               "SNAPPY: another size than the header's is refused");
    n = ZSTD_compress(packed, sizeof packed, text, sizeof text, 3);
    check_that(!fsdp_pq_decompress(PQ_ZSTD, packed, n, out, sizeof out) && !memcmp(out, text, sizeof text),
               "ZSTD page round trip");
    z_stream z;
    memset(&z, 0, sizeof z);
    deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
    z.next_in = (Bytef *)text, z.avail_in = sizeof text, z.next_out = packed, z.avail_out = sizeof packed;
    deflate(&z, Z_FINISH);
    n = sizeof packed - z.avail_out;
    deflateEnd(&z);
    check_that(!fsdp_pq_decompress(PQ_GZIP, packed, n, out, sizeof out) && !memcmp(out, text, sizeof text),
               "GZIP page round trip");
    packed[n / 2] ^= 0xff;
    check_that(fsdp_pq_decompress(PQ_GZIP, packed, n, out, sizeof out) != NULL, "GZIP: corrupt data refused");
    check_that(!fsdp_pq_codec_supported(7) && !strcmp(fsdp_pq_codec_name(7), "LZ4_RAW") && !fsdp_pq_codec_name(99),
               "LZ4_RAW named and unsupported, 99 unknown");
}

static void page_header(void) {
    /* PageHeader { 1: DATA_PAGE_V2 (3), 2: 100, 3: 60, 8: { 1: 7, 2: 1, 3: 7, 4: RLE_DICTIONARY (8), 5: 2, 6: 0 } } */
    const uint8_t h[] = {0x15, 0x06, 0x15, 0xc8, 0x01, 0x15, 0x78, 0x5c, 0x15, 0x0e, 0x15, 0x02, 0x15, 0x0e,
                         0x15, 0x10, 0x15, 0x04, 0x15, 0x00, 0x00, 0x00};
    fsdp_pq_page p;
    int rc = fsdp_pq_page_header(h, sizeof h, &p);
    check_that(rc == 1 && p.type == PQ_DATA_PAGE_V2 && p.uncompressed == 100 && p.compressed == 60 &&
                   p.num_values == 7 && p.encoding == PQ_RLE_DICTIONARY && p.def_len == 2 && p.rep_len == 0 &&
                   p.is_compressed && p.header_len == sizeof h,
               "a v2 page header decoded (rc %d)", rc);
    check_that(fsdp_pq_page_header(h, 9, &p) == 0, "a page header cut short asks for more bytes");
}

int main(void) {
    thrift();
    rle();
    plain();
    codecs();
    page_header();
    check_that(fsdp_crc32c("123456789", 9) == 0xe3069283u, "CRC-32C check value of \"123456789\"");
    return check_summary("test_parquet_decode");
}
