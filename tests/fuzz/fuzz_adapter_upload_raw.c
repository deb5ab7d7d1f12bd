/* libFuzzer harness for the raw adapter upload (ls_adapter_upload_parse_raw:
 * api/adapter_upload.c, format/safetensors.c, lora/adapter_config.c): a
 * safetensors body plus query parameters.
 *
 * Input: when it starts with '?', a query block follows: NUL-separated
 * "key=value" pairs (a pair without '=' is a key with an empty value), up
 * to a pair that is empty (two NULs in a row) or QUERY_MAX bytes; the rest
 * is the body. Any other input is all body and no query, so plain
 * safetensors files (tests/data/hostile) are seeds as they are.
 *
 * Each input is parsed twice, as POST /adapters (name required, strict
 * off) and as /adapters/validate (no name needed, strict on). It must be
 * either rejected cleanly (a status with a message, an error body, no
 * tensors left in the upload) or accepted: tensors that borrow from the body and
 * match their shape and dtype, no path, a valid name (or none for
 * validate), own and given parameters in range (r >= 0, finite alpha and
 * scale). An upload accepted with the name required is accepted without
 * it. Everything is freed with ls_adapter_upload_free (ASan's leak check).
 * Built only with clang (tests/fuzz/CMakeLists.txt). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/adapter_upload.h"
#include "api/forward.h"
#include "fuzz_common.h"

enum { QUERY_MAX = 512, PAIRS_MAX = 16 };

typedef struct {
    const char *key[PAIRS_MAX], *value[PAIRS_MAX];
    int n;
} query;

/* As a query string lookup does it: the first pair with that key. */
static const char *query_get(void *ctx, const char *key) {
    const query *q = ctx;
    FUZZ_CHECK(key);
    for (int i = 0; i < q->n; i++)
        if (!strcmp(q->key[i], key)) return q->value[i];
    return NULL;
}

/* Splits the query block of data (see above) into q, its text into *buf
 * (owned); returns the length of the block with its marker. */
static size_t query_split(const uint8_t *data, size_t size, query *q, char **buf) {
    q->n = 0;
    *buf = NULL;
    if (size == 0 || data[0] != '?') return 0;
    size_t len = 1;
    while (len < size && len < QUERY_MAX && !(data[len] == '\0' && data[len - 1] == '\0')) len++;
    size_t end = len < size ? len + 1 : len; /* the closing NUL belongs to the block */
    char *b = calloc(end + 1, 1);
    FUZZ_CHECK(b);
    const char *stop = b + end - 1;
    memcpy(b, data + 1, end - 1);
    for (char *p = b; p < stop && *p && q->n < PAIRS_MAX;) {
        size_t n = strlen(p);
        char *eq = strchr(p, '=');
        if (eq) *eq = '\0';
        q->key[q->n] = p;
        q->value[q->n] = eq ? eq + 1 : "";
        q->n++;
        p += n + 1;
    }
    *buf = b;
    return end;
}

static void check_params(const ls_adapter_params *p) {
    FUZZ_CHECK(p->format == LS_ADAPTER_FORMAT_AUTO || p->format == LS_ADAPTER_FORMAT_PEFT ||
               p->format == LS_ADAPTER_FORMAT_POOL);
    FUZZ_CHECK(p->r >= 0 && !p->whole_config);
    FUZZ_CHECK(isfinite(p->lora_alpha) && (p->has_alpha || p->lora_alpha == 0.0));
    FUZZ_CHECK(isfinite(p->scale) && (p->has_scale || p->scale == 0.0));
    FUZZ_CHECK(p->has_rslora || !p->use_rslora);
}

static void check_accepted(const ls_adapter_upload *up, const uint8_t *body, size_t len, bool require_name) {
    FUZZ_CHECK(FUZZ_TERMINATED(up->name) && up->path[0] == '\0');
    FUZZ_CHECK(up->name[0] ? ls_adapter_pool_name_valid(up->name) : !require_name);
    const ls_tensor_set *s = &up->tensors;
    for (size_t i = 0; i < s->n; i++) {
        const ls_tensor *t = &s->items[i].t;
        const uint8_t *p = t->data;
        FUZZ_CHECK(!t->owned && p >= body && t->nbytes <= len && (size_t)(p - body) <= len - t->nbytes);
        FUZZ_CHECK((size_t)ls_tensor_numel(t) * ls_dtype_size(t->dtype) == t->nbytes);
    }
    check_params(&up->own);
    check_params(&up->given);
    FUZZ_CHECK(!up->own.strict);
    ls_adapter_source src = ls_adapter_upload_source(up);
    FUZZ_CHECK(!src.path && src.tensors == &up->tensors);
}

/* One parse; true when accepted. */
static bool run(const uint8_t *body, size_t len, query *q, bool strict_default, bool require_name) {
    ls_adapter_upload *up = malloc(sizeof *up);
    FUZZ_CHECK(up);
    memset(up, 0xA5, sizeof *up); /* the parser must not read it */
    ls_error err;
    ls_error_init(&err);
    ls_status st = ls_adapter_upload_parse_raw(body, len, query_get, q, strict_default, require_name, up, &err);
    if (st == LS_OK) {
        FUZZ_CHECK(err.code == LS_OK);
        check_accepted(up, body, len, require_name);
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
    query q;
    char *qbuf;
    size_t off = query_split(data, size, &q, &qbuf);
    size_t len = size - off;
    uint8_t *body = malloc(len ? len : 1); /* exact size: ASan sees a read past the body */
    FUZZ_CHECK(body);
    if (len) memcpy(body, data + off, len);
    bool named = run(body, len, &q, false, true);
    bool anonymous = run(body, len, &q, true, false);
    FUZZ_CHECK(!named || anonymous);
    free(body);
    free(qbuf);
    return 0;
}
