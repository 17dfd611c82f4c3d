/* model.safetensors.index.json, read: {"metadata": {...}, "weight_map": {tensor: file}}. Every file
 * the map names is opened and checked, and the map must agree with the files' headers both ways.
 * "metadata" is informational (total_size, total_parameters) and not checked. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "jsonio.h"
#include "safetensors_internal.h"

/* A file name the map may use: relative, inside the index's directory. */
static int safe_name(const char *s) {
    if (!*s || s[0] == '/') return 0;
    for (const char *p = s; *p;) {
        const char *slash = strchr(p, '/');
        size_t n = slash ? (size_t)(slash - p) : strlen(p);
        if (n == 0 || (n == 2 && p[0] == '.' && p[1] == '.')) return 0;
        p += n + (slash ? 1 : 0);
    }
    return 1;
}

static int by_string(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

static json_t *load_index(const char *path, fsdp_err *err) {
    int fd;
    uint64_t size;
    if (fsdp_st_open_regular(path, &fd, &size, err)) return NULL;
    if (size > FSDP_ST_MAX_HEADER) {
        close(fd);
        fsdp_errf(err, "%s: %llu bytes: too large for an index", path, (unsigned long long)size);
        return NULL;
    }
    char *text = fsdp_xmalloc((size_t)size + 1, "the safetensors index");
    int rc = fsdp_st_pread_full(fd, text, (size_t)size, 0);
    int e = errno;
    close(fd);
    json_t *root = NULL;
    if (rc)
        fsdp_errf(err, "%s: cannot read: %s", path, e ? strerror(e) : "the file ended early");
    else
        root = fsdp_json_load_text(text, (size_t)size, path, err);
    free(text);
    return root;
}

/* The map's files, each once, sorted; NULL with err on a bad entry. */
static const char **map_files(const char *path, json_t *map, int *count, fsdp_err *err) {
    const char **names = fsdp_xmalloc((json_object_size(map) + 1) * sizeof *names, "the index's files");
    int n = 0;
    const char *key;
    json_t *v;
    json_object_foreach(map, key, v) {
        if (!json_is_string(v) || !safe_name(json_string_value(v))) {
            free(names);
            fsdp_errf(err, "%s: weight_map: tensor %s: the file must be a relative name inside the model directory",
                      path, key);
            return NULL;
        }
        names[n++] = json_string_value(v);
    }
    qsort(names, (size_t)n, sizeof *names, by_string);
    int unique = 0;
    for (int i = 0; i < n; i++)
        if (unique == 0 || strcmp(names[unique - 1], names[i])) names[unique++] = names[i];
    *count = unique;
    return names;
}

/* The map and the headers agree: every tensor of a file is mapped to that file, every mapped tensor
 * is in its file, no tensor is in two files. `names` are the files as the map spells them. */
static int check_map(const fsdp_st_set *s, const char *path, json_t *map, const char **names, fsdp_err *err) {
    for (int i = 0; i + 1 < s->num_tensors; i++)
        if (!strcmp(s->tensors[i].name, s->tensors[i + 1].name))
            return fsdp_errf(err, "%s: tensor %s is in two files: %s and %s", path, s->tensors[i].name,
                             fsdp_st_path(s, &s->tensors[i]), fsdp_st_path(s, &s->tensors[i + 1]));
    for (int i = 0; i < s->num_tensors; i++) {
        const fsdp_st_tensor *t = &s->tensors[i];
        const char *mapped = json_string_value(json_object_get(map, t->name));
        if (!mapped)
            return fsdp_errf(err, "%s: tensor %s is not in the index %s", fsdp_st_path(s, t), t->name, path);
        if (strcmp(mapped, names[t->file]))
            return fsdp_errf(err, "%s: tensor %s is in %s, but the index maps it to %s", path, t->name,
                             fsdp_st_path(s, t), mapped);
    }
    const char *key;
    json_t *v;
    json_object_foreach(map, key, v) {
        if (!fsdp_st_find(s, key))
            return fsdp_errf(err, "%s: weight_map maps tensor %s to %s, which does not contain it", path, key,
                             json_string_value(v));
    }
    return 0;
}

int fsdp_st_open_index(fsdp_st_set *s, const char *path, fsdp_err *err) {
    json_t *root = load_index(path, err);
    if (!root) return -1;
    int rc = 0, num_names = 0;
    json_t *map = json_object_get(root, "weight_map");
    const char **names = NULL;
    if (!json_is_object(root))
        rc = fsdp_errf(err, "%s: not a JSON object", path);
    else if (!json_is_object(map))
        rc = fsdp_errf(err, "%s: weight_map is %s", path, map ? "not an object" : "missing");
    else if (json_object_size(map) == 0)
        rc = fsdp_errf(err, "%s: weight_map is empty", path);
    else if (!(names = map_files(path, map, &num_names, err)))
        rc = -1;
    size_t dir_len = strrchr(path, '/') ? (size_t)(strrchr(path, '/') - path) : 0;
    for (int i = 0; i < num_names && rc == 0; i++) {
        size_t cap = dir_len + strlen(names[i]) + 2;
        char *file = fsdp_xmalloc(cap, "a file name");
        if (dir_len)
            snprintf(file, cap, "%.*s/%s", (int)dir_len, path, names[i]);
        else
            snprintf(file, cap, "%s", names[i]);
        struct stat st;
        if (lstat(file, &st) != 0)
            rc = fsdp_errf(err, "%s: weight_map names %s, which %s", path, file,
                           errno == ENOENT ? "does not exist" : strerror(errno));
        else
            rc = fsdp_st_add_file(s, file, err);
        free(file);
    }
    if (rc == 0) {
        fsdp_st_sort(s);
        rc = check_map(s, path, map, names, err);
    }
    free(names);
    json_decref(root);
    return rc;
}
