/* A Hugging Face checkpoint directory: config.json picks the family and its
 * layers (families.c); model.safetensors, or model.safetensors.index.json
 * and the shards its weight_map names, hold the tensors. Only the shards
 * that hold shared-expert tensors are opened, each once, and of each only
 * the header is read here: the byte ranges of the tensors wanted are read
 * later, layer by layer (model.c). Every name the index gives is checked
 * against the shard it points at; the index is the operator's file, so
 * messages may quote it. FP8 block-quantized weights are found here too
 * and dequantized when read. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/file.h"
#include "format/json.h"
#include "model/model_internal.h"

#define LS_CKPT_CONFIG "config.json"
#define LS_CKPT_SINGLE "model.safetensors"
#define LS_CKPT_INDEX "model.safetensors.index.json"
#define LS_CKPT_MAX_JSON (256u << 20)

typedef struct {
    int dirfd;
    const char *dir;      /* as given, for messages */
    json_t *config;       /* owned */
    json_t *index;        /* owned; NULL for a single file */
    json_t *map;          /* tensor name -> file name: the index's weight_map (borrowed), or the single file's */
    ls_st_header single;  /* the single file's header (n = 0 otherwise) */
    int single_fd;
    ls_family_plan plan;
    const char *prefix;
    json_t *wanted;       /* owned: tensor name -> layer * LS_MT_COUNT + which (scales: negative - 1) */
    int block[2];
} ls_ckpt;

/* Opens name in the checkpoint directory for reading. Links are followed
 * (the Hugging Face cache links every file to a blob elsewhere): names
 * come from the operator's own files, checked by ls_ckpt_name_ok. */
static int ls_ckpt_open(const ls_ckpt *c, const char *name) {
    return openat(c->dirfd, name, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
}

/* A shard name from the index: a path beneath the directory, no '..', not
 * absolute, no NUL inside. */
static bool ls_ckpt_name_ok(const json_t *v) {
    const char *s = json_string_value(v);
    if (!s || !*s || s[0] == '/' || strlen(s) != json_string_length(v) || strlen(s) > 1024) return false;
    for (const char *p = s; *p; p = strchr(p, '/') ? strchr(p, '/') + 1 : p + strlen(p))
        if (!strncmp(p, "..", 2) && (p[2] == '/' || p[2] == '\0')) return false;
    return true;
}

/* The key jansson found twice: the last string that ends before the error's
 * position (jansson reports a long key without it). */
static const char *ls_ckpt_dup_key(const char *text, size_t len, size_t pos, char *buf, size_t blen) {
    size_t end = pos < len ? pos : len;
    while (end > 0 && text[end - 1] != '"') end--;
    if (end == 0) return "";
    size_t start = end - 1;
    while (start > 0 && !(text[start - 1] == '"' && (start < 2 || text[start - 2] != '\\'))) start--;
    snprintf(buf, blen, "%.*s", (int)(end - 1 - start), text + start);
    return buf;
}

/* Reads name (at most LS_CKPT_MAX_JSON bytes) as one JSON object. */
static ls_status ls_ckpt_read_json(const ls_ckpt *c, const char *name, json_t **out, ls_error *err) {
    *out = NULL;
    int fd = ls_ckpt_open(c, name);
    if (fd < 0) {
        char ebuf[128];
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "cannot open %s/%s: %s", c->dir, name,
                            strerror_r(errno, ebuf, sizeof ebuf));
    }
    char what[4200];
    snprintf(what, sizeof what, "%s/%s", c->dir, name);
    uint8_t *data;
    size_t len;
    ls_status st = ls_file_read_fd(fd, LS_CKPT_MAX_JSON, &data, &len, what, LS_INVALID_REQUEST, err);
    close(fd);
    if (st != LS_OK) return st;
    json_error_t je;
    json_t *j = json_loadb((const char *)data, len, JSON_REJECT_DUPLICATES, &je);
    char key[256] = "";
    if (!j && json_error_code(&je) == json_error_duplicate_key)
        ls_ckpt_dup_key((const char *)data, len, (size_t)je.position, key, sizeof key);
    free(data);
    if (!j && key[0])
        return ls_error_set(err, LS_INVALID_REQUEST, "a name is given once: a tensor lives in one shard",
                            "%s is not valid JSON: duplicate object key \"%s\" (line %d)", what, key, je.line);
    if (!j) return ls_error_set(err, LS_INVALID_REQUEST, NULL, "%s is not valid JSON: %s (line %d)", what, je.text, je.line);
    if (!json_is_object(j)) {
        json_decref(j);
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "%s is %s, expected a JSON object", what, ls_json_kind(j));
    }
    *out = j;
    return LS_OK;
}

/* The index's weight_map: an object of tensor name to shard name;
 * metadata may be anything or absent. */
static ls_status ls_ckpt_load_index(ls_ckpt *c, const char *name, ls_model *m, ls_error *err) {
    /* --help lists a directory, its index or the fused file: the config
     * beside them is an easy slip, and "no weight_map" would not say so. */
    if (!strcmp(name, "config.json"))
        return ls_error_set(err, LS_INVALID_REQUEST, "give --weights the checkpoint directory itself",
                            "%s/config.json is the model's config, not an index of its weights: give --weights %s",
                            c->dir, c->dir);
    LS_MODEL_TRY(ls_ckpt_read_json(c, name, &c->index, err));
    c->map = json_object_get(c->index, "weight_map");
    if (!json_is_object(c->map))
        return ls_error_set(err, LS_INVALID_REQUEST, "an index of save_pretrained has {\"metadata\", \"weight_map\"}",
                            "%s/%s: weight_map is %s, expected an object of tensor name to file name", c->dir, name,
                            c->map ? ls_json_kind(c->map) : "missing");
    const char *key;
    json_t *v;
    json_object_foreach(c->map, key, v) {
        if (!ls_ckpt_name_ok(v))
            return ls_error_add(err, LS_INVALID_REQUEST, LS_NA, key, LS_NA, LS_NA, LS_NA,
                                "the weight_map names files beneath the checkpoint directory",
                                "%s/%s: weight_map puts %s in %s%s%s, not a file name beneath the directory", c->dir,
                                name, key, json_is_string(v) ? "\"" : "", json_is_string(v) ? json_string_value(v) : ls_json_kind(v),
                                json_is_string(v) ? "\"" : "");
    }
    return ls_model_add_file(m, name) ? LS_OK : ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
}

/* A single model.safetensors: its header is the map. */
static ls_status ls_ckpt_load_single(ls_ckpt *c, int fd, ls_error *err) {
    char what[4200];
    snprintf(what, sizeof what, "%s/%s", c->dir, LS_CKPT_SINGLE);
    c->single_fd = fd;
    LS_MODEL_TRY(ls_safetensors_read_header(fd, what, &c->single, err));
    c->map = c->index = json_object();
    for (size_t i = 0; c->map && i < c->single.n; i++)
        if (json_object_set_new(c->map, c->single.items[i].name, json_string(LS_CKPT_SINGLE)))
            return ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
    return c->map ? LS_OK : ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
}

/* model.safetensors when there is one (transformers' own order), else the
 * index; index_name given: that index. */
static ls_status ls_ckpt_load_map(ls_ckpt *c, const char *index_name, ls_model *m, ls_error *err) {
    if (index_name) return ls_ckpt_load_index(c, index_name, m, err);
    int fd = ls_ckpt_open(c, LS_CKPT_SINGLE);
    if (fd >= 0) return ls_ckpt_load_single(c, fd, err);
    if (errno != ENOENT) {
        char ebuf[128];
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "cannot open %s/%s: %s", c->dir, LS_CKPT_SINGLE,
                            strerror_r(errno, ebuf, sizeof ebuf));
    }
    struct stat sb;
    if (fstatat(c->dirfd, LS_CKPT_INDEX, &sb, 0) != 0)
        return ls_error_set(err, LS_INVALID_REQUEST,
                            "save_pretrained writes model.safetensors, or model.safetensors.index.json and its shards",
                            "%s has %s but neither %s nor %s", c->dir, LS_CKPT_CONFIG, LS_CKPT_SINGLE, LS_CKPT_INDEX);
    return ls_ckpt_load_index(c, LS_CKPT_INDEX, m, err);
}

/* The prefix the layers are saved under: the one of ls_family_prefixes
 * that holds the first served layer's gate_proj. */
static ls_status ls_ckpt_find_prefix(ls_ckpt *c, int first, ls_error *err) {
    char name[256], tried[800] = "";
    for (int i = 0; ls_family_prefixes[i]; i++) {
        ls_family_name(&c->plan, ls_family_prefixes[i], first, LS_PROJ_GATE, name, sizeof name);
        if (json_object_get(c->map, name)) {
            c->prefix = ls_family_prefixes[i];
            return LS_OK;
        }
        size_t l = strlen(tried);
        snprintf(tried + l, sizeof tried - l, "%s%s", l ? ", " : "", name);
    }
    return ls_error_set(err, LS_INVALID_REQUEST, "is this a checkpoint of the family its config.json names?",
                        "%s: config.json (%s, %s) gives layer %d shared experts, but the checkpoint has none of %s",
                        c->dir, c->plan.name, c->plan.rule, first, tried);
}

/* Marks name wanted as code (the tensor of a served layer), failing when
 * the checkpoint lacks it. */
static ls_status ls_ckpt_want(ls_ckpt *c, const char *name, int layer, long long code, ls_error *err) {
    if (!json_object_get(c->map, name))
        return ls_error_add(err, LS_INVALID_SHAPE, layer, name, LS_NA, LS_NA, LS_NA, NULL,
                            "%s: %s is missing (config.json's %s makes layer %d a layer with shared experts)", c->dir,
                            name, c->plan.rule, layer);
    return json_object_set_new(c->wanted, name, json_integer(code)) ? ls_error_set(err, LS_INTERNAL, NULL, "out of memory")
                                                                     : LS_OK;
}

/* DeepSeek's moe_layer_freq other than 1: DeepSeek's own code applies it,
 * transformers' does not, and both save the same names. The tensors tell
 * which wrote the checkpoint: a gate_proj on a layer that only
 * transformers' reading gives shared experts. The checks that follow hold
 * the tensors to the reading taken. */
static ls_status ls_ckpt_pick_reading(ls_ckpt *c, ls_error *err) {
    const ls_family_plan *p = &c->plan;
    if (!p->moe_alt) return LS_OK;
    bool alt = false;
    for (int l = 0; !alt && l < p->layers_total; l++) {
        for (int i = 0; p->moe_alt[l] && !p->moe[l] && ls_family_prefixes[i]; i++) {
            char name[256];
            ls_family_name(p, ls_family_prefixes[i], l, LS_PROJ_GATE, name, sizeof name);
            alt |= json_object_get(c->map, name) != NULL;
        }
    }
    if (alt) ls_family_plan_take_alt(&c->plan);
    for (int l = 0; l < p->layers_total; l++)
        if (p->moe[l]) return LS_OK;
    return ls_error_set(err, LS_INVALID_REQUEST, "lorasink serves shared experts; this model has none",
                        "config.json (%s family, %s) gives no layer shared experts", p->name, p->rule);
}

/* Every tensor of every served layer (and its FP8 scale, when the
 * checkpoint has one) goes to c->wanted; m gets the layer numbers. */
static ls_status ls_ckpt_plan_layers(ls_ckpt *c, ls_model *m, ls_error *err) {
    int L = 0;
    for (int l = 0; l < c->plan.layers_total; l++) L += c->plan.moe[l];
    if (!(m->layer_ids = malloc((size_t)L * sizeof *m->layer_ids)) || !(c->wanted = json_object()))
        return ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
    static const int which[LS_PROJ_COUNT] = {LS_MT_W13, LS_MT_UP, LS_MT_W2, LS_MT_GATE};
    int i = 0;
    for (int l = 0; l < c->plan.layers_total; l++) {
        if (!c->plan.moe[l]) continue;
        if (i == 0) LS_MODEL_TRY(ls_ckpt_find_prefix(c, l, err));
        m->layer_ids[i] = l;
        for (int p = 0; p < LS_PROJ_COUNT; p++) {
            if ((p == LS_PROJ_SCALAR_GATE && !c->plan.gate) || (p == LS_PROJ_UP && c->plan.fused)) continue;
            char name[256], scale[280];
            ls_family_name(&c->plan, c->prefix, l, p, name, sizeof name);
            const long long code = (long long)i * LS_MT_COUNT + which[p];
            LS_MODEL_TRY(ls_ckpt_want(c, name, l, code, err));
            snprintf(scale, sizeof scale, "%s_scale_inv", name);
            if (json_object_get(c->map, scale)) LS_MODEL_TRY(ls_ckpt_want(c, scale, l, -code - 1, err));
        }
        i++;
    }
    m->dims.L = L;
    return LS_OK;
}

/* Every tensor in a layer's shared-expert module: only the names the
 * layout has, and only on layers that config.json gives shared experts
 * (multi-token-prediction layers past num_hidden_layers are skipped). */
/* Whether rest (a name after the module) is a tensor the family's module
 * is read from: a projection's weight or its FP8 scale, or the gate. */
static bool ls_ckpt_known(const ls_family_plan *p, const char *rest) {
    if (!strcmp(rest, "shared_expert_gate.weight")) return p->gate;
    for (int k = LS_PROJ_GATE; k <= LS_PROJ_DOWN; k++) {
        const char *w = ls_family_proj(p, k);
        size_t n = w ? strlen(w) : 0;
        if (w && !strncmp(rest, w, n) && (!rest[n] || !strcmp(rest + n, "_scale_inv"))) return true;
    }
    return false;
}

static ls_status ls_ckpt_cross_check(const ls_ckpt *c, ls_error *err) {
    const char *key, *rest;
    json_t *v;
    long l;
    json_object_foreach(c->map, key, v) {
        if (!ls_family_in_module(&c->plan, c->prefix, key, &l, &rest) || l >= c->plan.layers_total) continue;
        if (!c->plan.gate && !strncmp(rest, "shared_expert_gate.", 19))
            return ls_error_add(err, LS_INVALID_SHAPE, (int)l, key, LS_NA, LS_NA, LS_NA,
                                "check config.json's model_type: a family with a gate (qwen2_moe) reads it",
                                "%s: the checkpoint has %s, but the %s family has no shared-expert gate: serving "
                                "without it would give other numbers than this model",
                                c->dir, key, c->plan.name);
        if (!ls_ckpt_known(&c->plan, rest))
            return ls_error_add(err, LS_INVALID_SHAPE, (int)l, key, LS_NA, LS_NA, LS_NA,
                                c->plan.fused ? "lorasink reads bias-free input_linear and output_linear weights "
                                                "(bf16, f16, f32, or FP8 with weight_scale_inv)"
                                              : "lorasink reads bias-free gate_proj, up_proj and down_proj weights "
                                                "(bf16, f16, f32, or FP8 with weight_scale_inv)",
                                "%s: unexpected shared-expert tensor %s", c->dir, key);
        if (!c->plan.moe[l])
            return ls_error_add(err, LS_INVALID_SHAPE, (int)l, key, LS_NA, LS_NA, LS_NA,
                                "config.json and the tensors must agree on which layers have shared experts",
                                "%s: the checkpoint has %s, but config.json's %s makes layer %ld dense", c->dir, key,
                                c->plan.rule, l);
    }
    return LS_OK;
}

/* ---- the shards ------------------------------------------------------------ */

/* Records the wanted tensors the map puts in shard (fd, header h, file
 * index file) and checks that h holds each of them and no wanted tensor
 * the map puts elsewhere. */
static ls_status ls_ckpt_take(ls_ckpt *c, const char *shard, const ls_st_header *h, int file, ls_model *m,
                              ls_error *err) {
    const char *key;
    json_t *v;
    json_object_foreach(c->wanted, key, v) {
        if (strcmp(json_string_value(json_object_get(c->map, key)), shard)) continue;
        const ls_st_info *t = ls_st_header_find(h, key);
        if (!t)
            return ls_error_add(err, LS_SAFETENSORS_INVALID, LS_NA, key, LS_NA, LS_NA, LS_NA,
                                "the index and its shards must agree (rewrite them with save_pretrained)",
                                "%s: the index puts %s in %s, whose header has no such tensor", c->dir, key, shard);
        long long code = json_integer_value(v);
        const bool scale = code < 0;
        if (scale) code = -code - 1;
        ls_model_tensor *mt = ls_model_tensor_at(m->src, (int)(code / LS_MT_COUNT), (int)(code % LS_MT_COUNT));
        if (!ls_model_info_copy(scale ? &mt->scale : &mt->info, t))
            return ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
        *(scale ? &mt->scale_file : &mt->file) = file;
        m->bytes += t->nbytes;
    }
    for (size_t i = 0; i < h->n; i++) {
        const json_t *in = json_object_get(c->map, h->items[i].name);
        if (json_object_get(c->wanted, h->items[i].name) && strcmp(json_string_value(in), shard))
            return ls_error_add(err, LS_SAFETENSORS_INVALID, LS_NA, h->items[i].name, LS_NA, LS_NA, LS_NA,
                                "a tensor belongs in one shard",
                                "%s: %s is in %s and in %s (where the index puts it)", c->dir, h->items[i].name, shard,
                                json_string_value(in));
    }
    return LS_OK;
}

/* Opens one shard, reads its header and takes its wanted tensors. */
static ls_status ls_ckpt_shard(ls_ckpt *c, const char *shard, ls_model *m, ls_error *err) {
    char what[4200];
    snprintf(what, sizeof what, "%s/%s", c->dir, shard);
    const bool single = c->single_fd >= 0;
    int fd = single ? c->single_fd : ls_ckpt_open(c, shard);
    if (fd < 0) {
        char ebuf[128];
        return ls_error_set(err, LS_INVALID_REQUEST, "every shard the index names must be in the directory",
                            "cannot open %s, which the index names: %s", what, strerror_r(errno, ebuf, sizeof ebuf));
    }
    c->single_fd = -1; /* the source owns it from here */
    int file = ls_model_source_add_fd(m->src, fd, what);
    if (file < 0) return ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
    if (!ls_model_add_file(m, shard)) return ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode))
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "%s is not a regular file", what);
    if (single) return ls_ckpt_take(c, shard, &c->single, file, m, err);
    ls_st_header h;
    LS_MODEL_TRY(ls_safetensors_read_header(fd, what, &h, err));
    ls_status st = ls_ckpt_take(c, shard, &h, file, m, err);
    ls_st_header_free(&h);
    return st;
}

/* Each shard that holds a wanted tensor, once, in the order the wanted
 * tensors name them. */
static ls_status ls_ckpt_shards(ls_ckpt *c, ls_model *m, ls_error *err) {
    json_t *done = json_object();
    if (!done) return ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
    ls_status st = LS_OK;
    const char *key;
    json_t *v;
    json_object_foreach(c->wanted, key, v) {
        const char *shard = json_string_value(json_object_get(c->map, key));
        if (json_object_get(done, shard)) continue;
        if (json_object_set_new(done, shard, json_true())) st = ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
        if (st == LS_OK) st = ls_ckpt_shard(c, shard, m, err);
        if (st != LS_OK) break;
    }
    json_decref(done);
    return st;
}

/* ---- shapes, dtypes and FP8 --------------------------------------------------- */

/* quantization_config, when config.json has one, must be fp8 blocks. */
static ls_status ls_ckpt_quant(ls_ckpt *c, ls_error *err) {
    c->block[0] = c->block[1] = 128;
    const json_t *q = json_object_get(c->config, "quantization_config");
    if (!q || json_is_null(q)) return LS_OK;
    const char *method = json_string_value(json_object_get(q, "quant_method"));
    if (!method || strcmp(method, "fp8"))
        return ls_error_set(err, LS_INVALID_REQUEST,
                            "dequantize the checkpoint to bf16 first (for example load it with transformers and "
                            "save_pretrained it unquantized)",
                            "config.json's quantization_config has quant_method \"%s\": lorasink reads bf16, f16 and "
                            "f32 weights and dequantizes FP8 blocks (quant_method \"fp8\") only",
                            method ? method : "(none)");
    const json_t *b = json_object_get(q, "weight_block_size");
    if (!b || json_is_null(b)) return LS_OK;
    if (!json_is_array(b) || json_array_size(b) != 2 || !json_is_integer(json_array_get(b, 0)) ||
        !json_is_integer(json_array_get(b, 1)) || json_integer_value(json_array_get(b, 0)) < 1 ||
        json_integer_value(json_array_get(b, 1)) < 1 || json_integer_value(json_array_get(b, 0)) > 1 << 20 ||
        json_integer_value(json_array_get(b, 1)) > 1 << 20)
        return ls_error_set(err, LS_INVALID_REQUEST, NULL,
                            "config.json's weight_block_size must be two positive integers [rows, columns]");
    c->block[0] = (int)json_integer_value(json_array_get(b, 0));
    c->block[1] = (int)json_integer_value(json_array_get(b, 1));
    return LS_OK;
}

/* A 2D tensor of shape [rows, cols]; FP8 only with its scale
 * [ceil(rows / b0), ceil(cols / b1)]. */
static ls_status ls_ckpt_check_tensor(const ls_ckpt *c, const ls_model_tensor *t, int layer, int64_t rows,
                                      int64_t cols, ls_model *m, ls_error *err) {
    const ls_st_info *i = &t->info;
    char got[96];
    if (i->ndim != 2 || i->shape[0] != rows || i->shape[1] != cols)
        return ls_error_add(err, LS_INVALID_SHAPE, layer, i->name, i->ndim != 2 ? LS_NA : i->shape[0] != rows ? 0 : 1,
                            i->ndim != 2 ? 2 : i->shape[0] != rows ? rows : cols,
                            i->ndim != 2 ? i->ndim : i->shape[0] != rows ? i->shape[0] : i->shape[1], NULL,
                            "%s: %s has shape %s, expected [%lld, %lld] (from config.json: H = %d, F = %d)", c->dir,
                            i->name, ls_shape_str(i->shape, i->ndim, got, sizeof got), (long long)rows,
                            (long long)cols, c->plan.H, c->plan.F);
    if (ls_dtype_is_float(i->dtype) && t->scale_file < 0) return LS_OK;
    if (i->dtype != LS_DTYPE_F8_E4M3 || t->scale_file < 0)
        return ls_error_add(err, LS_SAFETENSORS_INVALID, layer, i->name, LS_NA, LS_NA, LS_NA,
                            "dequantize the checkpoint to bf16 first",
                            "%s: %s has dtype %s%s: lorasink reads F32, F16, BF16, or F8_E4M3 with a float32 "
                            "weight_scale_inv over blocks",
                            c->dir, i->name, ls_dtype_name(i->dtype),
                            t->scale_file >= 0 ? " with a weight_scale_inv" : " without a weight_scale_inv");
    const ls_st_info *s = &t->scale;
    const int64_t sr = (rows + c->block[0] - 1) / c->block[0], sc = (cols + c->block[1] - 1) / c->block[1];
    if (!ls_dtype_is_float(s->dtype) || s->ndim != 2 || s->shape[0] != sr || s->shape[1] != sc)
        return ls_error_add(err, LS_INVALID_SHAPE, layer, s->name, LS_NA, LS_NA, LS_NA, NULL,
                            "%s: %s is %s %s, expected a float [%lld, %lld] (blocks of %d x %d)", c->dir, s->name,
                            ls_dtype_name(s->dtype), ls_shape_str(s->shape, s->ndim, got, sizeof got), (long long)sr,
                            (long long)sc, c->block[0], c->block[1]);
    m->fp8 = true;
    return LS_OK;
}

/* Every served tensor's shape against config.json's H and F, and the
 * dtype to serve: the tensors' own, F32 when they differ. */
static ls_status ls_ckpt_check(const ls_ckpt *c, ls_model *m, ls_error *err) {
    const int64_t H = c->plan.H, F = c->plan.F;
    bool first = true;
    for (int i = 0; i < m->dims.L; i++) {
        const int l = m->layer_ids[i];
        for (int w = 0; w < LS_MT_COUNT; w++) {
            const ls_model_tensor *t = ls_model_tensor_at(m->src, i, w);
            if ((w == LS_MT_GATE && !c->plan.gate) || (w == LS_MT_UP && c->plan.fused)) continue;
            const int64_t rows = w == LS_MT_GATE ? 1 : w == LS_MT_W2 ? H : w == LS_MT_W13 && c->plan.fused ? 2 * F : F;
            LS_MODEL_TRY(ls_ckpt_check_tensor(c, t, l, rows, w == LS_MT_W2 ? F : H, m, err));
            if (w == LS_MT_GATE) continue; /* the gate keeps its own dtype */
            const ls_dtype dt = ls_model_served_dtype(t);
            m->dtype = first || m->dtype == dt ? dt : LS_DTYPE_F32;
            first = false;
        }
    }
    return LS_OK;
}

/* ---- FP8 dequantization ------------------------------------------------------- */

void ls_model_dequant_fp8(const uint8_t *q, const void *scale, ls_dtype scale_dt, int64_t rows, int64_t cols,
                          const int *block, ls_dtype dtype, void *dst) {
    const int64_t sc = (cols + block[1] - 1) / block[1];
    float s = 0.0f;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < cols; j++) {
            if (j % block[1] == 0) {
                const size_t at = (size_t)((r / block[0]) * sc + j / block[1]);
                ls_convert_dtype(scale_dt, (const char *)scale + at * ls_dtype_size(scale_dt), LS_DTYPE_F32, &s, 1);
            }
            const size_t i = (size_t)(r * cols + j);
            const uint16_t b = ls_f32_to_bf16(ls_f8e4m3_to_f32(q[i]) * s);
            if (dtype == LS_DTYPE_BF16) memcpy((char *)dst + 2 * i, &b, 2);
            else ((float *)dst)[i] = ls_bf16_to_f32(b);
        }
    }
}

/* ---- the whole --------------------------------------------------------------- */

static ls_status ls_ckpt_run(ls_ckpt *c, const char *index_name, ls_model *m, ls_error *err) {
    LS_MODEL_TRY(ls_ckpt_read_json(c, LS_CKPT_CONFIG, &c->config, err));
    if (!ls_model_add_file(m, LS_CKPT_CONFIG)) return ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
    LS_MODEL_TRY(ls_family_plan_from_config(c->config, &c->plan, err));
    LS_MODEL_TRY(ls_ckpt_quant(c, err));
    LS_MODEL_TRY(ls_ckpt_load_map(c, index_name, m, err));
    LS_MODEL_TRY(ls_ckpt_pick_reading(c, err));
    LS_MODEL_TRY(ls_ckpt_plan_layers(c, m, err));
    LS_MODEL_TRY(ls_ckpt_cross_check(c, err));
    if (!(m->src = ls_model_source_new(m->dims.L))) return ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
    m->src->block[0] = c->block[0], m->src->block[1] = c->block[1];
    LS_MODEL_TRY(ls_ckpt_shards(c, m, err));
    LS_MODEL_TRY(ls_ckpt_check(c, m, err));
    m->dims = (ls_dims){.n = 1, .H = c->plan.H, .F = c->plan.F, .L = m->dims.L, .w13_layout = LS_W13_CONTIGUOUS,
                        .gate = c->plan.gate, .layer_ids = m->layer_ids, .layers_total = c->plan.layers_total,
                        .peft_targets = c->plan.peft_targets};
    snprintf(m->family, sizeof m->family, "%s", c->plan.name);
    snprintf(m->model_type, sizeof m->model_type, "%s", c->plan.model_type);
    snprintf(m->architecture, sizeof m->architecture, "%s", c->plan.architecture);
    snprintf(m->rule, sizeof m->rule, "%s", c->plan.rule);
    return LS_OK;
}

/* See model_internal.h. On failure m keeps what it gathered for the
 * caller to free. */
ls_status ls_model_open_checkpoint(const char *dir_path, const char *index_name, ls_model *m, ls_error *err) {
    ls_ckpt c = {.dirfd = -1, .dir = dir_path, .single_fd = -1};
    c.dirfd = open(dir_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    ls_status st = LS_OK;
    if (c.dirfd < 0) {
        char ebuf[128];
        st = ls_error_set(err, LS_INVALID_REQUEST, NULL, "cannot open the checkpoint directory %s: %s", dir_path,
                          strerror_r(errno, ebuf, sizeof ebuf));
    }
    if (st == LS_OK) st = ls_ckpt_run(&c, index_name, m, err);
    if (c.single_fd >= 0) close(c.single_fd);
    ls_st_header_free(&c.single);
    ls_family_plan_free(&c.plan);
    json_decref(c.wanted);
    json_decref(c.index);
    json_decref(c.config);
    if (c.dirfd >= 0) close(c.dirfd);
    return st;
}
