/* Hugging Face tokenizer.json (model type BPE) -> a plain C description of the tokenizer.
 *
 * The reader checks every field it takes and refuses, with one message naming the file and the JSON
 * field path ("tokenizer.json: normalizer.normalizers[1].type 'Precompiled' is not supported"), everything
 * that src/text cannot do exactly as the `tokenizers` library does: other models (WordPiece,
 * Unigram), other normalizers, pre-tokenizers, post-processors and decoders, BPE dropout,
 * continuing-subword prefixes and end-of-word suffixes other than the empty string (which change
 * nothing), truncation and padding. It builds no lookup structure: the algorithms (src/text) do
 * that from this description.
 *
 * Supported: normalizer NFC, NFD, NFKC, NFKD, Lowercase, Strip, Prepend, Replace, Sequence;
 * pre-tokenizer Split, ByteLevel, Digits (read as the Split it is), Sequence; model BPE (vocab,
 * merges as "a b" strings or [a, b] pairs, unk_token, fuse_unk, byte_fallback, ignore_merges);
 * post-processor TemplateProcessing, ByteLevel, Sequence; decoder ByteLevel, Replace, ByteFallback,
 * Fuse, Strip, Sequence; added tokens with all their flags. */
#ifndef FSDP_IO_TOKENIZER_JSON_H
#define FSDP_IO_TOKENIZER_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "../base/error.h"

/* Owned bytes, NUL-terminated for convenience (the length is what counts: text may hold NUL). */
typedef struct {
    char *s;
    size_t n;
} fsdp_tj_str;

typedef enum {
    FSDP_TJ_NORM_PREPEND,
    FSDP_TJ_NORM_REPLACE,
    FSDP_TJ_NORM_NFC,
    FSDP_TJ_NORM_NFD,
    FSDP_TJ_NORM_NFKC,
    FSDP_TJ_NORM_NFKD,
    FSDP_TJ_NORM_LOWERCASE,
    FSDP_TJ_NORM_STRIP
} fsdp_tj_norm_kind;
typedef struct {
    fsdp_tj_norm_kind kind;
    int strip_left, strip_right; /* Strip */
    fsdp_tj_str text;    /* Prepend: what is prepended; Replace: the pattern */
    int regex;           /* Replace: the pattern is {"Regex": ...} rather than {"String": ...} */
    fsdp_tj_str content; /* Replace: the replacement */
    char field[128];     /* its JSON path, for messages: "normalizer.normalizers[1]" */
} fsdp_tj_normalizer;

typedef enum { FSDP_TJ_PRE_SPLIT, FSDP_TJ_PRE_BYTE_LEVEL } fsdp_tj_pre_kind;
/* SplitDelimiterBehavior of tokenizers. */
typedef enum {
    FSDP_SPLIT_REMOVED,
    FSDP_SPLIT_ISOLATED,
    FSDP_SPLIT_MERGED_WITH_PREVIOUS,
    FSDP_SPLIT_MERGED_WITH_NEXT,
    FSDP_SPLIT_CONTIGUOUS
} fsdp_split_behavior;
typedef struct {
    fsdp_tj_pre_kind kind;
    fsdp_tj_str pattern; /* Split */
    int regex;           /* Split: {"Regex": ...} (else a literal {"String": ...}) */
    fsdp_split_behavior behavior;
    int invert;
    int add_prefix_space, use_regex; /* ByteLevel */
    char field[128];                 /* its JSON path, for messages */
} fsdp_tj_pretokenizer;

/* One piece of a TemplateProcessing "single" template: the sequence, or a special token's ids. */
typedef struct {
    int is_sequence;
    uint32_t *ids;
    int num_ids;
} fsdp_tj_template_piece;
typedef struct {
    fsdp_tj_template_piece *pieces;
    int num_pieces;
} fsdp_tj_template;

typedef enum {
    FSDP_TJ_DEC_BYTE_LEVEL,
    FSDP_TJ_DEC_REPLACE,
    FSDP_TJ_DEC_BYTE_FALLBACK,
    FSDP_TJ_DEC_FUSE,
    FSDP_TJ_DEC_STRIP
} fsdp_tj_dec_kind;
typedef struct {
    fsdp_tj_dec_kind kind;
    fsdp_tj_str pattern, content; /* Replace (pattern is a literal unless regex); Strip: content is one char */
    int regex;
    uint32_t strip_char; /* Strip: the content's code point */
    int start, stop;     /* Strip */
    char field[128];     /* its JSON path, for messages */
} fsdp_tj_decoder;

typedef struct {
    uint32_t id;
    fsdp_tj_str content;
    int single_word, lstrip, rstrip, normalized, special;
} fsdp_tj_added_token;

typedef struct {
    /* model (BPE) */
    fsdp_tj_str *vocab; /* indexed by id; s == NULL for an id no token has */
    uint32_t vocab_size; /* 1 + the largest id of the model's vocab */
    fsdp_tj_str (*merges)[2];
    size_t num_merges;
    fsdp_tj_str unk_token; /* s == NULL: none */
    int fuse_unk, byte_fallback, ignore_merges;

    fsdp_tj_added_token *added;
    int num_added;
    fsdp_tj_normalizer *normalizers;
    int num_normalizers;
    fsdp_tj_pretokenizer *pretokenizers;
    int num_pretokenizers;
    fsdp_tj_template *templates; /* TemplateProcessing steps in order (ByteLevel steps change no id) */
    int num_templates;
    fsdp_tj_decoder *decoders;
    int num_decoders;
    int has_decoder; /* 0: tokens are joined with spaces, as tokenizers does without a decoder */

    /* Identity: FNV-1a 64 of the file's canonical JSON (keys sorted, compact, Jansson). */
    uint64_t hash;
} fsdp_tokenizer_spec;

/* Reads and checks `path`; on failure err names the file and the field. */
int fsdp_tokenizer_spec_load(const char *path, fsdp_tokenizer_spec *spec, fsdp_err *err);
void fsdp_tokenizer_spec_free(fsdp_tokenizer_spec *spec);
/* The identity `hash` of the spec (what token files record) of any tokenizer.json, whether or not
 * fsdp.c can tokenize with it: a model directory's tokenizer, checked against a token file. */
int fsdp_tokenizer_json_hash(const char *path, uint64_t *hash, fsdp_err *err);

#endif
