/* libFuzzer harness for adapter normalisation (lora/adapter*.c: the name
 * grammar, the PEFT and pool checks, ranks and scales from the config's
 * patterns, the fusion and the shared-expert gate's fold): a raw
 * safetensors upload (its __metadata__ carrying r, lora_alpha and the
 * PEFT keys) parsed as POST /adapters/validate parses it, then
 * normalised for three servers: a gated Qwen-like model (n = 1), the
 * same on a backend that does not apply the gate, and an ungated model
 * of two experts with a per-expert pool.
 *
 * Each normalisation either refuses cleanly (a status with its error
 * body, the adapter left zeroed) or gives an adapter that fits its pool:
 * its layers, rank and outer size in range, one block of the layout's
 * size per layer (the gate's H floats more exactly when it has the
 * gate's factors, which only a gated model applying them takes), finite
 * values, a digest that is its data's, and a slot write's expansion
 * reading only its own data (ASan). Built only with clang
 * (tests/fuzz/CMakeLists.txt). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/adapter_upload.h"
#include "fuzz_common.h"
#include "lora/adapter.h"
#include "lora/adapter_config.h"

static const char *no_query(void *ctx, const char *key) {
    (void)ctx, (void)key;
    return NULL;
}

typedef struct {
    ls_dims d;
    ls_pool_dims p;
} fuzz_server;

static const fuzz_server SERVERS[] = {
    {{.n = 1, .H = 8, .F = 4, .L = 2, .w13_layout = LS_W13_CONTIGUOUS, .gate = true},
     {.slots = 2, .max_rank = 4, .layout = LS_LORA_SHARED, .max_tokens = 8}},
    {{.n = 1, .H = 8, .F = 4, .L = 2, .w13_layout = LS_W13_CONTIGUOUS, .gate = true},
     {.slots = 2, .max_rank = 4, .layout = LS_LORA_SHARED, .max_tokens = 8, .no_gate_lora = true}},
    {{.n = 2, .H = 4, .F = 3, .L = 2, .w13_layout = LS_W13_INTERLEAVED},
     {.slots = 2, .max_rank = 4, .layout = LS_LORA_PER_EXPERT, .max_tokens = 8}},
};

static bool zeroed(const ls_adapter *a) {
    static const ls_adapter zero;
    return !memcmp(a, &zero, sizeof zero);
}

static void check_adapter(const ls_adapter *a, const fuzz_server *s) {
    const ls_dims *d = &s->d;
    const ls_pool_dims *p = &s->p;
    FUZZ_CHECK(a->layers == d->L && a->data && a->layer_present);
    FUZZ_CHECK(a->meta.rank >= 1 && a->meta.rank <= p->max_rank);
    FUZZ_CHECK(a->meta.outer == 1 || (a->meta.outer == d->n && p->layout == LS_LORA_PER_EXPERT));
    FUZZ_CHECK(!a->meta.gate || (d->gate && !p->no_gate_lora));
    FUZZ_CHECK(a->layer_floats == ls_adapter_layer_floats(d, a->meta.outer, a->meta.rank, a->meta.gate));
    const size_t count = (size_t)a->layers * a->layer_floats;
    for (size_t i = 0; i < count; i++) FUZZ_CHECK(isfinite(a->data[i]));
    FUZZ_CHECK(isfinite(a->meta.scale) && a->meta.bytes == ls_adapter_host_bytes(a));
    char hex[65];
    ls_adapter_digest(a->data, count, hex);
    FUZZ_CHECK(!strcmp(hex, a->meta.sha256));
    for (size_t i = 0; i < a->meta.n_ignored; i++) FUZZ_CHECK(a->ignored[i] && a->ignored[i][0]);
    for (int k = 0; k < LS_ADAPTER_WARNINGS; k++) FUZZ_CHECK(FUZZ_TERMINATED(a->warnings[k]));
    /* A slot write's buffers, exactly as long as the pool's. */
    float *buf[4];
    const size_t len[4] = {ls_pool_gu_a_len(d, p), ls_pool_gu_b_len(d, p), ls_pool_d_a_len(d, p),
                           ls_pool_d_b_len(d, p)};
    for (int k = 0; k < 4; k++) FUZZ_CHECK((buf[k] = malloc(len[k] * sizeof(float))));
    for (int l = 0; l < d->L; l++) {
        ls_adapter_expand(a, l, d, p, buf[0], buf[1], buf[2], buf[3]);
        const float *g = ls_adapter_gate(a, l, d);
        FUZZ_CHECK(!g || (a->meta.gate && g >= a->data && g + d->H <= a->data + count));
    }
    for (int k = 0; k < 4; k++) free(buf[k]);
}

static void normalise(const ls_tensor_set *tensors, const ls_adapter_params *params, const fuzz_server *s) {
    ls_adapter a;
    memset(&a, 0x5A, sizeof a); /* normalise must not read it */
    ls_error err;
    ls_error_init(&err);
    ls_status st = ls_adapter_normalise(tensors, params, &s->d, &s->p, &a, &err);
    if (st == LS_OK) {
        FUZZ_CHECK(err.code == LS_OK);
        check_adapter(&a, s);
        ls_adapter_free(&a);
    } else {
        fuzz_check_error(st, &err);
        FUZZ_CHECK(zeroed(&a));
    }
    ls_error_free(&err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *body = malloc(size ? size : 1); /* exact size: ASan sees a read past the body */
    FUZZ_CHECK(body);
    if (size) memcpy(body, data, size);
    ls_adapter_upload *up = calloc(1, sizeof *up);
    FUZZ_CHECK(up);
    ls_error err;
    ls_error_init(&err);
    if (ls_adapter_upload_parse_raw(body, size, no_query, NULL, false, false, up, &err) == LS_OK) {
        /* As the loader takes a raw body: its per-module rules from the
         * __metadata__, merged under what the request said. */
        ls_adapter_params own = up->own;
        ls_status st = ls_adapter_params_rules_from_meta(&up->tensors, "the body's __metadata__", &own, &err);
        if (st == LS_OK) {
            const ls_adapter_params used = ls_adapter_params_merge(&own, &up->given);
            for (size_t i = 0; i < sizeof SERVERS / sizeof *SERVERS; i++) normalise(&up->tensors, &used, &SERVERS[i]);
        } else {
            fuzz_check_error(st, &err);
        }
    }
    ls_adapter_upload_free(up);
    free(up);
    ls_error_free(&err);
    free(body);
    return 0;
}
