/* `fsdp tokenize`: text on standard input -> ids on standard output, one line each (or, with
 * --decode, ids -> text): the tool to check a tokenizer against Hugging Face's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../base/args.h"
#include "../base/error.h"
#include "../base/output_paths.h"
#include "../io/jsonio.h"
#include "../io/tokenizer_config.h"
#include "../text/tokenizer.h"
#include "commands.h"

static const char EPILOGUE[] =
    "Each input line is one text: its ids are written on one line, separated by spaces. The line's\n"
    "terminating newline is not part of the text (a last line without one is still a line); a carriage\n"
    "return before it is. With --json each line is a JSON string instead (so a text can hold newlines),\n"
    "and --decode writes each text as a JSON string. Text must be valid UTF-8: a line that is not is\n"
    "refused with its number. Ids are those of Hugging Face's tokenizers for the same tokenizer.json:\n"
    "  echo 'Hello world!' | fsdp tokenize --tokenizer tokenizer.json\n"
    "  echo '9906 1917 0' | fsdp tokenize --tokenizer tokenizer.json --decode\n";

typedef struct {
    const fsdp_tokenizer *tok;
    fsdp_tokenizer_state *state;
    int add_special, skip_special, json;
} session;

/* The text of one input line (the line itself, or the JSON string it holds); *owned set when the
 * text was allocated. */
static int line_text(const session *s, char *line, size_t n, long lineno, char **text, size_t *len, json_t **owned,
                     fsdp_err *err) {
    *owned = NULL;
    if (!s->json) {
        *text = line, *len = n;
        return 0;
    }
    char origin[64];
    snprintf(origin, sizeof origin, "<stdin>: line %ld", lineno);
    json_t *v = fsdp_json_load_value(line, n, origin, err);
    if (!v) return -1;
    if (!json_is_string(v)) {
        json_decref(v);
        return fsdp_errf(err, "<stdin>: line %ld: not a JSON string (--json reads one string per line)", lineno);
    }
    *text = (char *)json_string_value(v), *len = json_string_length(v), *owned = v;
    return 0;
}

static int encode_line(const session *s, char *line, size_t n, long lineno, fsdp_ids *ids, fsdp_err *err) {
    char *text = NULL;
    size_t len = 0;
    json_t *owned = NULL;
    if (line_text(s, line, n, lineno, &text, &len, &owned, err)) return -1;
    ids->n = 0;
    fsdp_err e = {0};
    int rc = fsdp_tokenizer_encode(s->tok, s->state, text, len, s->add_special, ids, &e);
    json_decref(owned);
    if (rc) return fsdp_errf(err, "<stdin>: line %ld: %s", lineno, e.msg);
    for (size_t i = 0; i < ids->n; i++) printf(i ? " %u" : "%u", ids->p[i]);
    putchar('\n');
    return 0;
}

static int decode_line(const session *s, const char *line, size_t n, long lineno, fsdp_ids *ids, fsdp_buf *text,
                       fsdp_err *err) {
    ids->n = 0;
    for (size_t i = 0; i < n;) {
        if (line[i] == ' ' || line[i] == '\t' || line[i] == '\r') {
            i++;
            continue;
        }
        unsigned long long v = 0;
        size_t start = i;
        while (i < n && line[i] >= '0' && line[i] <= '9' && v <= UINT32_MAX) v = v * 10 + (unsigned)(line[i++] - '0');
        if (i == start || (i < n && line[i] != ' ' && line[i] != '\t' && line[i] != '\r') || v > UINT32_MAX)
            return fsdp_errf(err, "<stdin>: line %ld: '%.*s' is not a token id", lineno,
                             (int)(strcspn(line + start, " \t\r") < 40 ? strcspn(line + start, " \t\r") : 40), line + start);
        fsdp_ids_push(ids, (uint32_t)v);
    }
    text->n = 0;
    fsdp_err e = {0};
    if (fsdp_tokenizer_decode(s->tok, s->state, ids->p, ids->n, s->skip_special, text, &e))
        return fsdp_errf(err, "<stdin>: line %ld: %s", lineno, e.msg);
    if (s->json) {
        char *lit = fsdp_json_string_literal(text->p, text->n);
        if (!lit) fsdp_fatal("out of host memory writing a JSON string");
        puts(lit);
        free(lit);
    } else {
        fwrite(text->p, 1, text->n, stdout);
        putchar('\n');
    }
    return 0;
}

int fsdp_cmd_tokenize(int argc, char **argv) {
    fsdp_err err = {0};
    const char *path = NULL;
    int no_special = 0, decode = 0, skip_special = 0, json = 0;
    fsdp_arg args[] = {
        {"tokenizer", FSDP_ARG_STRING, &path, "FILE|DIR",
         "A Hugging Face tokenizer.json (model type BPE) or its directory, with the tokenizer_config.json beside it "
         "if any. Required.", 1, 0,
         NULL, 0},
        {"no-special", FSDP_ARG_BOOL, &no_special, NULL,
         "Do not add the post-processor's special tokens (add_special_tokens=False); special tokens written in the "
         "text are still recognised.", 1, 0, NULL, 0},
        {"decode", FSDP_ARG_BOOL, &decode, NULL, "Read lines of ids and write their text instead.", 1, 0, NULL, 0},
        {"skip-special-tokens", FSDP_ARG_BOOL, &skip_special, NULL, "With --decode: leave special tokens out.", 1, 0,
         NULL, 0},
        {"json", FSDP_ARG_BOOL, &json, NULL,
         "Texts are JSON strings, one per line (input, or with --decode output).", 1, 0, NULL, 0},
    };
    fsdp_arg_spec spec = {"tokenize", "Encode text to token ids (or decode ids) with a Hugging Face tokenizer.json.",
                          "fsdp tokenize --tokenizer FILE [--no-special] [--decode] < input", EPILOGUE, args,
                          (int)(sizeof args / sizeof args[0])};
    int rc = fsdp_args_parse(&spec, argc, argv, stdout, &err);
    if (rc == 1) return 0;
    if (rc < 0) fsdp_exit_error(&err, 0);
    if (!path) {
        fsdp_usagef(&err, "tokenize: --tokenizer FILE is required");
        fsdp_exit_error(&err, 0);
    }
    /* Standard output is never a file tokenize reads: `< f >> f` would read what it appends, for
     * ever (base/output_paths.h). */
    char tok_json[4300], tok_config[4300];
    if (fsdp_tokenizer_files(path, tok_json, sizeof tok_json, tok_config, sizeof tok_config, &err))
        fsdp_exit_error(&err, 0);
    fsdp_io_path writes[] = {FSDP_IO_STREAM("standard output", STDOUT_FILENO)};
    fsdp_io_path reads[] = {FSDP_IO_STREAM("standard input", STDIN_FILENO), FSDP_IO_FILE("--tokenizer", tok_json),
                            FSDP_IO_FILE("--tokenizer's tokenizer_config.json", tok_config)};
    if (fsdp_outputs_apart(writes, 1, reads, tok_config[0] ? 3 : 2, &err)) fsdp_exit_error(&err, 0);
    fsdp_tokenizer *tok = fsdp_tokenizer_load(path, &err);
    if (!tok) fsdp_exit_error(&err, 0);
    session s = {tok, fsdp_tokenizer_state_new(tok), !no_special, skip_special, json};
    static char outbuf[1 << 16];
    setvbuf(stdout, outbuf, _IOFBF, sizeof outbuf);
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    long lineno = 0;
    fsdp_ids ids = {0};
    fsdp_buf text = {0};
    while ((got = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        size_t n = (size_t)got;
        if (n && line[n - 1] == '\n') line[--n] = 0;
        rc = decode ? decode_line(&s, line, n, lineno, &ids, &text, &err) : encode_line(&s, line, n, lineno, &ids, &err);
        if (rc) break;
    }
    if (!rc && ferror(stdin)) rc = fsdp_errf(&err, "<stdin>: read error after line %ld", lineno);
    if (fflush(stdout) != 0 && !rc) rc = fsdp_errf(&err, "<stdout>: write error");
    free(line);
    fsdp_ids_free(&ids);
    fsdp_buf_free(&text);
    fsdp_tokenizer_state_free(s.state);
    fsdp_tokenizer_free(tok);
    if (rc) fsdp_exit_error(&err, 0);
    return 0;
}
