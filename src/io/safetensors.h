/* safetensors: Hugging Face's weight files (docs/FORMATS.md, "safetensors"), read and written.
 *
 * A file is an 8-byte little-endian header length N, N bytes of JSON (UTF-8, starting with '{',
 * possibly padded with spaces) and the tensor data. The header maps each tensor name to
 * {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the end of the header) and
 * may hold "__metadata__", a map of strings to strings. A model of several files comes with
 * model.safetensors.index.json: {"metadata": {...}, "weight_map": {tensor: file}}.
 *
 * The JSON goes through Jansson (jsonio.h); only the binary framing and the element conversions
 * are written by hand, because no C library reads safetensors by byte ranges with positioned reads.
 *
 * Reading (fsdp_st_open) validates every file of a model up front and fails with one message that
 * names the file and, where one is at fault, the tensor: a header length past the end of the file,
 * a malformed header (not an object; dtype, shape or data_offsets of the wrong type, negative or
 * not integers; an unknown dtype; __metadata__ not a map of strings), offsets out of bounds,
 * overlapping, leaving holes or not matching shape x dtype, a truncated file, an index naming a
 * missing file or a file outside the directory, a tensor in two files. Files that are not regular
 * files (FIFOs, devices) are refused without blocking. fsdp_st_check then compares the tensors with
 * the ones the caller expects (missing, unexpected, shape, a dtype that cannot be converted).
 * fsdp_st_read_f32 reads any element range of a tensor with pread at computed offsets, converting
 * BF16, F16 and F32 to fp32; it is thread-safe and reads large ranges on several OpenMP threads.
 * fsdp_st_read_raw and fsdp_st_convert_f32 are its two halves, for callers that pipeline them.
 *
 * Writing (safetensors_write.h) is split from reading. Both assume a little-endian host. */
#ifndef FSDP_IO_SAFETENSORS_H
#define FSDP_IO_SAFETENSORS_H

#include <stdint.h>

#include "../base/error.h"

/* Every dtype the format defines; fsdp.c converts BF16, F16 and F32 and refuses the others by name. */
typedef enum {
    FSDP_ST_BOOL, FSDP_ST_U8, FSDP_ST_I8, FSDP_ST_I16, FSDP_ST_U16, FSDP_ST_I32, FSDP_ST_U32, FSDP_ST_I64,
    FSDP_ST_U64, FSDP_ST_F16, FSDP_ST_BF16, FSDP_ST_F32, FSDP_ST_F64, FSDP_ST_C64, FSDP_ST_F8_E5M2,
    FSDP_ST_F8_E4M3, FSDP_ST_F8_E8M0, FSDP_ST_F6_E2M3, FSDP_ST_F6_E3M2, FSDP_ST_F4, FSDP_ST_NUM_DTYPES
} fsdp_st_dtype;

/* The header's spelling ("BF16") and the size of one element in bits. */
const char *fsdp_st_dtype_name(fsdp_st_dtype t);
int fsdp_st_dtype_bits(fsdp_st_dtype t);
/* 1 for the dtypes fsdp_st_read_f32 converts (BF16, F16, F32). */
int fsdp_st_dtype_readable(fsdp_st_dtype t);

#define FSDP_ST_MAX_DIMS 8
#define FSDP_ST_MAX_HEADER 100000000ull /* the reference implementation's limit */

typedef struct {
    char *name;
    fsdp_st_dtype dtype;
    int ndim;
    int64_t shape[FSDP_ST_MAX_DIMS];
    int64_t numel;
    uint64_t offset; /* absolute byte offset of the data in its file */
    uint64_t nbytes;
    int file;        /* index into the set's files */
} fsdp_st_tensor;

typedef struct {
    char *path;
    int fd;
    int direct_fd;   /* the same file opened with O_DIRECT (fsdp_st_open_direct), -1 when not */
    uint64_t size;
} fsdp_st_file;

/* The tensors of one model: one file, or the files of an index. */
typedef struct {
    char *origin;             /* what messages about the whole set name: the file or the index */
    fsdp_st_file *files;
    int num_files;
    fsdp_st_tensor *tensors;  /* sorted by name */
    int num_tensors;
} fsdp_st_set;

/* The weights file of a model directory, as transformers looks for it: "model.safetensors", else
 * "model.safetensors.index.json". Returns 1 and the path in out, 0 when the directory has neither. */
int fsdp_st_find_weights(const char *dir, char *out, int cap);

/* Opens and validates a .safetensors file or a model.safetensors.index.json with every file it
 * names. On failure *out is left empty and err names the problem. */
int fsdp_st_open(const char *path, fsdp_st_set *out, fsdp_err *err);
void fsdp_st_close(fsdp_st_set *s);

/* The tensor of that name, or NULL. */
const fsdp_st_tensor *fsdp_st_find(const fsdp_st_set *s, const char *name);
static inline const char *fsdp_st_path(const fsdp_st_set *s, const fsdp_st_tensor *t) { return s->files[t->file].path; }

/* What a caller expects to find. `file_name` is the name the tensor has in the files. */
typedef struct {
    const char *file_name;
    int ndim;
    int64_t shape[FSDP_ST_MAX_DIMS];
    int optional; /* absent is fine (a tied lm_head.weight) */
} fsdp_st_expect;

/* Checks the set against the expected tensors: each present (unless optional) with that shape and a
 * readable dtype, and no other tensor except names ending in one of `ignored_suffixes` (a
 * NULL-terminated list, may be NULL). The first defect, in the set's name order, is the message. */
int fsdp_st_check(const fsdp_st_set *s, const fsdp_st_expect *want, int num_want, const char *const *ignored_suffixes,
                  fsdp_err *err);

/* Reads elements [start, start + count) (row-major) of t as fp32 into out. */
int fsdp_st_read_f32(const fsdp_st_set *s, const fsdp_st_tensor *t, int64_t start, int64_t count, float *out,
                     fsdp_err *err);

/* The two halves of fsdp_st_read_f32, for a caller that keeps the disk reading while it converts:
 * fsdp_st_read_raw reads the bytes of elements [start, start + count) of t as the file holds them
 * (count x fsdp_st_dtype_bits / 8 bytes) with one positioned read on the calling thread (thread-safe);
 * fsdp_st_convert_f32 turns count elements of a readable dtype into fp32 on the calling thread (raw
 * may be at any address). */
int fsdp_st_read_raw(const fsdp_st_set *s, const fsdp_st_tensor *t, int64_t start, int64_t count, void *out,
                     fsdp_err *err);
void fsdp_st_convert_f32(fsdp_st_dtype dtype, const void *raw, int64_t count, float *out);

/* Reads that bypass the page cache, for a caller that reads a whole model once from a cold disk:
 * several O_DIRECT reads in flight keep the device's queue full without the kernel's read-ahead
 * and the copy out of the cache (--init-from of Llama-3.2-1B and Llama-2-7B on an H100 host: 90-125%
 * of dd's cold read this way, 81-92% through the cache; bench/results/2026-11-26-*-hf-io-direct.md).
 * fsdp_st_open_direct opens every file of the set a second time with O_DIRECT; a file whose file
 * system refuses it keeps reading through the cache.
 * fsdp_st_read_raw_aligned is fsdp_st_read_raw through a buffer `buf` aligned to
 * FSDP_ST_DIRECT_ALIGN of at least fsdp_st_aligned_cap(bytes) bytes: it reads the whole blocks
 * around the range and sets *data to the range's first byte inside buf (buf itself when the read
 * went through the cache, which it does for a file without O_DIRECT or a read the kernel refused
 * unaligned). Thread-safe. */
#define FSDP_ST_DIRECT_ALIGN 4096
void fsdp_st_open_direct(fsdp_st_set *s);
size_t fsdp_st_aligned_cap(size_t bytes);
int fsdp_st_read_raw_aligned(const fsdp_st_set *s, const fsdp_st_tensor *t, int64_t start, int64_t count, void *buf,
                             const void **data, fsdp_err *err);

/* IEEE half -> float, exactly (subnormals, infinities and NaNs included). */
float fsdp_f16_to_f32(uint16_t h);

#endif
