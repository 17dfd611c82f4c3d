/* config.json, generation_config.json and the existing-model check of hf_model_dir.h. */
#include "hf_model_dir.h"

#include <dirent.h>
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "hf_config.h"
#include "jsonio.h"
#include "safetensors_write.h"

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

int fsdp_hf_dir_has_model(const char *dir, char *what, size_t cap) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int found = 0;
    while (!found && (e = readdir(d)) != NULL) {
        const char *n = e->d_name;
        found = !strcmp(n, "config.json") || !strcmp(n, "generation_config.json") ||
                !strcmp(n, "model.safetensors.index.json") || ends_with(n, ".safetensors");
        if (found && what && cap) {
            strncpy(what, n, cap - 1);
            what[cap - 1] = 0;
        }
    }
    closedir(d);
    return found;
}

int fsdp_hf_write_json_tmp(const char *dir, const char *name, const json_t *v, int precision, fsdp_err *err) {
    char *text = fsdp_json_text(v, 2, precision);
    if (!text) fsdp_fatal("out of host memory writing %s", name);
    size_t n = strlen(text);
    char *line = realloc(text, n + 2);
    if (!line) fsdp_fatal("out of host memory writing %s", name);
    memcpy(line + n, "\n", 2);
    int rc = fsdp_write_file_tmp(dir, name, line, n + 1, err);
    free(line);
    return rc;
}

static void set_id(json_t *obj, const char *key, int id) {
    if (id >= 0) json_object_set_new(obj, key, json_integer(id));
}

int fsdp_hf_stage_configs(const char *dir, const fsdp_model_config *cfg, const char *dtype, fsdp_err *err) {
    char text[16384];
    int len = fsdp_hf_config_write(cfg, text, sizeof text);
    if (len < 0) return fsdp_errf(err, "%s/config.json: the model's config does not fit in %zu bytes", dir, sizeof text);
    json_t *config = fsdp_json_load_text(text, (size_t)len, "the model's config.json", err);
    if (!config) return -1;
    json_object_set_new(config, "dtype", json_string(dtype));
    json_object_set_new(config, "torch_dtype", json_string(dtype));
    /* Nine significant digits give back every float32 the config holds, in its shortest form. */
    int rc = fsdp_hf_write_json_tmp(dir, "config.json", config, 9, err);
    json_decref(config);
    if (rc) return -1;

    json_t *gen = json_object();
    json_object_set_new(gen, "_from_model_config", json_true());
    set_id(gen, "bos_token_id", cfg->bos_token_id);
    set_id(gen, "eos_token_id", cfg->eos_token_id);
    set_id(gen, "pad_token_id", cfg->pad_token_id);
    rc = fsdp_hf_write_json_tmp(dir, "generation_config.json", gen, 9, err);
    json_decref(gen);
    return rc;
}

int fsdp_hf_publish_configs(const char *dir, fsdp_err *err) {
    if (fsdp_rename_tmp(dir, "generation_config.json", err)) return -1;
    return fsdp_rename_tmp(dir, "config.json", err);
}
