/* The peers' numbers for bench_gpu: the JSON lines of bench/torch_ref.py
 * (PyTorch eager and PyTorch in a CUDA graph) and bench/bench_gpu_http.py
 * (forwards through the server), read into one list this file owns. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_bench.h"

typedef struct {
    char kind[16]; /* "eager", "graph" or "http" */
    char body[32]; /* http: the body format */
    int rank, T, adapters;
    double ms;
} ref_row;

static ref_row *g_refs;
static size_t g_nrefs, g_cap;

static int get_int(json_t *j, const char *key) { return (int)json_integer_value(json_object_get(j, key)); }

/* Appends one row parsed from j; lines without a numeric "ms" (the
 * header line naming the device) are not rows. */
static void add_row(json_t *j) {
    json_t *ms = json_object_get(j, "ms");
    if (!json_is_number(ms)) return;
    if (g_nrefs == g_cap) {
        size_t cap = g_cap ? 2 * g_cap : 64;
        ref_row *p = realloc(g_refs, cap * sizeof *p);
        if (!p) return;
        g_refs = p;
        g_cap = cap;
    }
    ref_row *r = &g_refs[g_nrefs++];
    memset(r, 0, sizeof *r);
    const char *variant = json_string_value(json_object_get(j, "variant"));
    const char *body = json_string_value(json_object_get(j, "body"));
    snprintf(r->kind, sizeof r->kind, "%s", body ? "http" : variant ? variant : "eager");
    snprintf(r->body, sizeof r->body, "%s", body ? body : "");
    r->rank = get_int(j, "rank");
    r->T = get_int(j, "T");
    r->adapters = get_int(j, "adapters");
    r->ms = json_number_value(ms);
}

void refs_load(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "bench_gpu: cannot open %s; its columns stay empty\n", path);
        return;
    }
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        json_error_t je;
        json_t *j = json_loads(line, 0, &je);
        if (!j) continue;
        add_row(j);
        json_decref(j);
    }
    fclose(f);
}

double refs_torch_ms(const char *variant, int rank, int T, int adapters) {
    for (size_t i = 0; i < g_nrefs; i++) {
        const ref_row *r = &g_refs[i];
        if (!strcmp(r->kind, variant) && r->rank == rank && r->T == T && r->adapters == adapters) return r->ms;
    }
    return 0;
}

int refs_http(int i, int *T, int *adapters, const char **body, double *ms) {
    int seen = 0;
    for (size_t k = 0; k < g_nrefs; k++) {
        const ref_row *r = &g_refs[k];
        if (strcmp(r->kind, "http") != 0) continue;
        if (seen++ < i) continue;
        *T = r->T;
        *adapters = r->adapters;
        *body = r->body;
        *ms = r->ms;
        return 1;
    }
    return 0;
}

void refs_free(void) {
    free(g_refs);
    g_refs = NULL;
    g_nrefs = g_cap = 0;
}
