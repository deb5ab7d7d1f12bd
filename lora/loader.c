/* Adapter sources to normalised adapters: path resolution beneath the
 * adapter directory, reading a PEFT directory or a .safetensors file
 * (the file stays mapped only while its tensors are read), the merge of
 * stated over own parameters, normalisation. */
#include "lora/loader.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/file.h"
#include "format/safetensors.h"
#include "lora/adapter_config.h"

/* realpath of both; see loader.h. */
ls_status ls_loader_resolve(const char *dir, const char *rel, char *out, size_t out_len, ls_error *err) {
    char base[PATH_MAX], joined[PATH_MAX * 2], real[PATH_MAX];
    if (!realpath(dir && *dir ? dir : ".", base))
        return ls_error_set(err, LS_INTERNAL, "check --adapter-dir", "the adapter directory %.200s cannot be resolved: %s",
                            dir && *dir ? dir : ".", strerror(errno));
    /* A cut path could resolve to another file than the one named. */
    int jl = rel[0] == '/' ? snprintf(joined, sizeof joined, "%s", rel)
                           : snprintf(joined, sizeof joined, "%s/%s", base, rel);
    if (jl < 0 || (size_t)jl >= sizeof joined)
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "path \"%.200s...\" is too long", rel);
    if (!realpath(joined, real))
        return ls_error_set(err, LS_INVALID_REQUEST, "paths are taken relative to --adapter-dir",
                            "path \"%.200s\" cannot be read: %s", rel, strerror(errno));
    size_t bl = strlen(base);
    bool inside = !strcmp(base, "/") || (!strncmp(real, base, bl) && (real[bl] == '/' || real[bl] == '\0'));
    if (!inside)
        return ls_error_set(err, LS_INVALID_REQUEST, "adapters must live under --adapter-dir (no '..' or symlinks out)",
                            "path \"%.200s\" resolves outside the adapter directory %.200s", rel, base);
    if (strlen(real) >= out_len)
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "path \"%.200s\" is too long", rel);
    snprintf(out, out_len, "%s", real);
    return LS_OK;
}

/* Reads a resolved path (PEFT directory or .safetensors file): fills
 * tensors (borrowing from map) and what the file says of itself. */
static ls_status ls_loader_read(const char *path, ls_adapter_params *own, ls_tensor_set *tensors, ls_file_map *map,
                                ls_error *err) {
    struct stat sb;
    if (stat(path, &sb))
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "%.200s cannot be read: %s", path, strerror(errno));
    char file[PATH_MAX + 64];
    ls_status st;
    bool peft_dir = S_ISDIR(sb.st_mode);
    if (peft_dir) {
        char cfgpath[PATH_MAX + 64], *text = NULL;
        snprintf(cfgpath, sizeof cfgpath, "%s/adapter_config.json", path);
        st = ls_file_read_text(cfgpath, 1 << 20, &text, LS_ADAPTER_CONFIG_INVALID, err);
        if (st != LS_OK) return st;
        st = ls_adapter_config_parse_text(text, own, err);
        free(text);
        if (st != LS_OK) return st;
        own->format = LS_ADAPTER_FORMAT_PEFT;
        snprintf(file, sizeof file, "%s/adapter_model.safetensors", path);
        if (stat(file, &sb))
            return ls_error_set(err, LS_INVALID_REQUEST, "a PEFT directory holds adapter_model.safetensors",
                                "%.200s has no adapter_model.safetensors: %s", path, strerror(errno));
    } else {
        snprintf(file, sizeof file, "%s", path);
    }
    if ((st = ls_file_map_open(file, map, LS_INVALID_REQUEST, err)) != LS_OK) return st;
    st = ls_safetensors_parse(map->data, map->len, tensors, err);
    /* A PEFT directory's config wins; a bare file carries its own. */
    if (st == LS_OK && !peft_dir) {
        ls_adapter_text_params t = {ls_tensor_set_meta(tensors, "lora_alpha"), ls_tensor_set_meta(tensors, "use_rslora"),
                                    ls_tensor_set_meta(tensors, "format"), ls_tensor_set_meta(tensors, "r"),
                                    ls_tensor_set_meta(tensors, "scale")};
        st = ls_adapter_params_from_text(&t, own, err);
    }
    if (st != LS_OK) {
        ls_tensor_set_free(tensors);
        ls_file_map_close(map);
    }
    return st;
}

/* Reads path and normalises it into out with *used: given merged over
 * what the file says (merge), or given as it is (a reload: given already
 * holds what the file said when it was loaded). */
static ls_status ls_loader_from_path(const ls_loader *ld, const char *path, const ls_adapter_params *given, bool merge,
                                     ls_adapter_params *used, ls_adapter *out, ls_error *err) {
    ls_adapter_params own = {0};
    ls_tensor_set set;
    ls_tensor_set_init(&set);
    ls_file_map map = {0};
    ls_status st = ls_loader_read(path, &own, &set, &map, err);
    if (st != LS_OK) return st;
    *used = merge ? ls_adapter_params_merge(&own, given) : *given;
    st = ls_adapter_normalise(&set, used, &ld->dims, &ld->pool, out, err);
    ls_tensor_set_free(&set);
    ls_file_map_close(&map);
    return st;
}

ls_status ls_loader_load(const ls_loader *ld, const ls_adapter_source *src, ls_adapter *out, ls_adapter_origin *origin,
                         ls_error *err) {
    memset(out, 0, sizeof *out);
    memset(origin, 0, sizeof *origin);
    if (!src->path) {
        origin->params = ls_adapter_params_merge(&src->own, &src->given);
        return ls_adapter_normalise(src->tensors, &origin->params, &ld->dims, &ld->pool, out, err);
    }
    ls_status st = ls_loader_resolve(ld->adapter_dir, src->path, origin->path, sizeof origin->path, err);
    if (st == LS_OK) st = ls_loader_from_path(ld, origin->path, &src->given, true, &origin->params, out, err);
    if (st != LS_OK) origin->path[0] = '\0';
    return st;
}

ls_status ls_loader_reload(void *ctx, const char *path, const ls_adapter_params *params, ls_adapter *out,
                           ls_error *err) {
    ls_adapter_params used;
    memset(out, 0, sizeof *out);
    return ls_loader_from_path(ctx, path, params, false, &used, out, err);
}
