/* libFuzzer harness for the safetensors reader: any input must be either
 * rejected cleanly (safetensors_invalid, a message, an empty set) or parse
 * into tensors that lie inside the input, write back, and read back the
 * same. Built only with clang (tests/fuzz/CMakeLists.txt). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "format/safetensors.h"

/* A crash here is a finding: abort() is what libFuzzer records. */
#define FUZZ_CHECK(cond)                                                                                          \
    do {                                                                                                           \
        if (!(cond)) abort();                                                                                      \
    } while (0)

static void check_same(const ls_tensor_set *a, const ls_tensor_set *b) {
    FUZZ_CHECK(a->n == b->n && a->n_meta == b->n_meta);
    for (size_t i = 0; i < a->n; i++) {
        const ls_tensor *x = &a->items[i].t, *y = &b->items[i].t;
        FUZZ_CHECK(!strcmp(a->items[i].name, b->items[i].name));
        FUZZ_CHECK(x->dtype == y->dtype && x->ndim == y->ndim && x->nbytes == y->nbytes);
        FUZZ_CHECK(!memcmp(x->shape, y->shape, (size_t)x->ndim * sizeof *x->shape));
        FUZZ_CHECK(x->nbytes == 0 || !memcmp(x->data, y->data, x->nbytes));
    }
    for (size_t i = 0; i < a->n_meta; i++) {
        FUZZ_CHECK(!strcmp(a->meta[i].key, b->meta[i].key));
        FUZZ_CHECK(!strcmp(a->meta[i].value, b->meta[i].value));
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ls_tensor_set s;
    ls_error err;
    ls_tensor_set_init(&s);
    ls_error_init(&err);
    ls_status st = ls_safetensors_parse(data, size, &s, &err);
    if (st != LS_OK) {
        FUZZ_CHECK(st == LS_SAFETENSORS_INVALID && err.code == st && err.message[0] && err.n_violations >= 1);
        FUZZ_CHECK(s.n == 0 && s.n_meta == 0 && !s.items && !s.meta);
        ls_error_free(&err);
        return 0;
    }
    for (size_t i = 0; i < s.n; i++) {
        const ls_tensor *t = &s.items[i].t;
        const uint8_t *p = t->data;
        FUZZ_CHECK(!t->owned && p >= data && t->nbytes <= size && (size_t)(p - data) <= size - t->nbytes);
        FUZZ_CHECK((size_t)ls_tensor_numel(t) * ls_dtype_size(t->dtype) == t->nbytes);
    }
    uint8_t *out;
    size_t len;
    FUZZ_CHECK(ls_safetensors_write(&s, &out, &len, &err) == LS_OK);
    ls_tensor_set back;
    ls_tensor_set_init(&back);
    FUZZ_CHECK(ls_safetensors_parse(out, len, &back, &err) == LS_OK);
    check_same(&s, &back);
    ls_tensor_set_free(&back);
    free(out);
    ls_tensor_set_free(&s);
    ls_error_free(&err);
    return 0;
}
