/* libFuzzer harness for the JSON adapter upload body
 * (ls_adapter_upload_parse_json: api/adapter_upload.c, api/json_tensor.c,
 * lora/adapter_config.c). Each body is parsed twice, as POST /adapters
 * (name required, strict off) and as /adapters/validate (no name needed,
 * strict on). Any body must be either
 *  - rejected cleanly: a status with a message, an error body, no tensors
 *    left in the upload; or
 *  - accepted as a path or as tensors (never both): a valid name (or none
 *    for validate), owned tensors whose bytes match their shape and dtype
 *    under distinct names, parameters in range (r >= 0, and >= 1 for a
 *    whole config; finite alpha and scale), nothing in own (a JSON body
 *    states only given).
 * And LS_INVALID_JSON exactly when jansson (JSON_REJECT_DUPLICATES, as the
 * body was parsed before it was read in one pass) rejects the body, less
 * what the reader refuses by design (reader_stricter).
 * An upload accepted with the name required is accepted without it.
 * Everything is freed with ls_adapter_upload_free (ASan's leak check).
 * Built only with clang (tests/fuzz/CMakeLists.txt). */
#include <math.h>
#include <sanitizer/allocator_interface.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/adapter_upload.h"
#include "api/forward.h"
#include "fuzz_common.h"

static void check_params(const ls_adapter_params *p) {
    FUZZ_CHECK(p->format == LS_ADAPTER_FORMAT_AUTO || p->format == LS_ADAPTER_FORMAT_PEFT ||
               p->format == LS_ADAPTER_FORMAT_POOL);
    FUZZ_CHECK(p->r >= 0 && (!p->whole_config || p->r >= 1));
    FUZZ_CHECK(isfinite(p->lora_alpha) && (p->has_alpha || p->lora_alpha == 0.0));
    FUZZ_CHECK(isfinite(p->scale) && (p->has_scale || p->scale == 0.0));
    FUZZ_CHECK(p->has_rslora || !p->use_rslora);
}

static void check_accepted(const ls_adapter_upload *up, bool require_name) {
    FUZZ_CHECK(FUZZ_TERMINATED(up->name) && FUZZ_TERMINATED(up->path));
    FUZZ_CHECK(up->name[0] ? ls_adapter_pool_name_valid(up->name) : !require_name);
    const ls_tensor_set *s = &up->tensors;
    if (up->path[0]) FUZZ_CHECK(s->n == 0);
    FUZZ_CHECK(s->n_meta == 0);
    for (size_t i = 0; i < s->n; i++) {
        const ls_tensor *t = &s->items[i].t;
        FUZZ_CHECK(s->items[i].name && t->owned && t->ndim >= 0 && t->ndim <= LS_MAX_DIMS);
        FUZZ_CHECK(ls_tensor_numel(t) >= 0 && (size_t)ls_tensor_numel(t) * ls_dtype_size(t->dtype) == t->nbytes);
        if (t->nbytes) FUZZ_CHECK(__sanitizer_get_allocated_size(t->data) >= t->nbytes);
        for (size_t k = 0; k < i && k < 64; k++) FUZZ_CHECK(strcmp(s->items[k].name, s->items[i].name));
    }
    static const ls_adapter_params none;
    FUZZ_CHECK(!memcmp(&up->own, &none, sizeof none));
    check_params(&up->given);
    ls_adapter_source src = ls_adapter_upload_source(up);
    FUZZ_CHECK(src.tensors == &up->tensors && (src.path != NULL) == (up->path[0] != '\0'));
}

/* What the one-pass reader refuses and jansson takes: a number of 512
 * characters or more, and a NUL byte (jansson skips one after a number). */
static bool reader_stricter(const char *body, size_t size, const ls_error *err) {
    return strstr(err->message, "number too long") || memchr(body, '\0', size);
}

/* One parse; true when accepted. */
static bool run(const char *body, size_t size, bool strict_default, bool require_name) {
    ls_adapter_upload *up = malloc(sizeof *up);
    FUZZ_CHECK(up);
    memset(up, 0xA5, sizeof *up); /* the parser must not read it */
    ls_error err;
    ls_error_init(&err);
    ls_status st = ls_adapter_upload_parse_json(body, size, strict_default, require_name, up, &err);
    json_error_t je;
    json_t *doc = json_loadb(body, size, JSON_REJECT_DUPLICATES, &je);
    if (!doc) FUZZ_CHECK(st == LS_INVALID_JSON);
    else FUZZ_CHECK(st != LS_INVALID_JSON || reader_stricter(body, size, &err));
    json_decref(doc);
    if (st == LS_OK) {
        FUZZ_CHECK(err.code == LS_OK);
        check_accepted(up, require_name);
    } else {
        fuzz_check_error(st, &err);
        const ls_tensor_set *s = &up->tensors;
        FUZZ_CHECK(!s->n && !s->items && !s->n_meta && !s->meta); /* nothing owned */
    }
    ls_adapter_upload_free(up);
    free(up);
    ls_error_free(&err);
    return st == LS_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *body = malloc(size ? size : 1); /* exact size, not NUL-terminated */
    FUZZ_CHECK(body);
    if (size) memcpy(body, data, size);
    bool named = run(body, size, false, true);
    bool anonymous = run(body, size, true, false);
    FUZZ_CHECK(!named || anonymous);
    free(body);
    return 0;
}
