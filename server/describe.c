/* Adapter and pool snapshots as the JSON of docs/api.md. */
#include "server/describe.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

const char *ls_describe_time(int64_t ms, char *buf, size_t len) {
    if (ms <= 0) {
        buf[0] = '\0';
        return buf;
    }
    time_t sec = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&sec, &tm);
    int n = snprintf(buf, len, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                     tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(ms % 1000));
    if (n < 0 || (size_t)n >= len) buf[0] = '\0'; /* a year past 9999: no time rather than a cut one */
    return buf;
}

static json_t *ls_describe_time_json(int64_t ms) {
    char buf[40];
    return ms > 0 ? json_string(ls_describe_time(ms, buf, sizeof buf)) : json_null();
}

json_t *ls_describe_warnings(const char (*warnings)[512]) {
    json_t *arr = json_array();
    for (int k = 0; arr && k < LS_ADAPTER_WARNINGS; k++)
        if (warnings[k][0]) json_array_append_new(arr, json_string(warnings[k]));
    return arr;
}

json_t *ls_describe_adapter(const ls_server *srv, const ls_adapter_info *a) {
    const char *state = a->slot >= 0 ? "resident" : a->host_data ? "host" : "disk";
    json_t *j = json_pack("{s:s, s:I, s:i, s:f, s:s, s:s, s:b, s:s, s:o, s:I, s:s, s:i, s:o, s:I}", "name", a->name,
                          "version", (json_int_t)a->version, "rank", a->meta.rank, "scale", a->meta.scale, "format",
                          ls_adapter_format_name(a->meta.format), "layout", a->meta.outer > 1 ? "per-expert" : "shared",
                          "pinned", a->pinned, "state", state, "slot", a->slot >= 0 ? json_integer(a->slot) : json_null(),
                          "bytes", (json_int_t)a->meta.bytes, "sha256", a->meta.sha256, "in_flight", a->in_flight, "last_used",
                          ls_describe_time_json(a->last_used_ms), "hits", (json_int_t)a->hits);
    if (j) json_object_set_new(j, "source", a->source_path[0] ? json_string(a->source_path) : json_null());
    if (j) json_object_set_new(j, "auto_loaded", json_boolean(a->auto_loaded));
    if (j) json_object_set_new(j, "shared_expert_gate", json_boolean(a->meta.gate));
    if (j) json_object_set_new(j, "warnings", ls_describe_warnings(a->warnings));
    /* The order only means something for PEFT factors (pool buffers have one). */
    if (j && a->meta.format == LS_ADAPTER_FORMAT_PEFT)
        json_object_set_new(j, "gate_up_order", json_string(ls_gate_up_order_name(a->gate_up_order)));
    (void)srv;
    return j;
}

static const char *ls_slot_state_name(ls_slot_state s) {
    return s == LS_SLOT_RESIDENT ? "resident" : s == LS_SLOT_LOADING ? "loading" : "free";
}

json_t *ls_describe_pool(ls_server *srv, ls_error *err) {
    ls_slot_info *slots = NULL;
    ls_pool_stats st;
    if (ls_pool_snapshot(srv->pool, &slots, &st, err) != LS_OK) return NULL;
    json_t *jslots = json_array();
    for (int i = 0; jslots && i < st.slots; i++) {
        const ls_slot_info *s = &slots[i];
        bool used = s->state != LS_SLOT_FREE;
        json_array_append_new(
            jslots, json_pack("{s:i, s:s, s:o, s:o, s:o, s:b, s:i, s:o, s:I, s:o}", "index", s->index, "state",
                              ls_slot_state_name(s->state), "adapter", used ? json_string(s->adapter) : json_null(),
                              "version", used ? json_integer((json_int_t)s->version) : json_null(), "rank",
                              used ? json_integer(s->rank) : json_null(), "pinned", used && s->pinned, "in_flight",
                              s->in_flight, "last_used", ls_describe_time_json(s->last_used_ms), "hits",
                              (json_int_t)s->hits, "live", used ? json_boolean(s->live) : json_null()));
    }
    free(slots);
    json_t *ids = json_array();
    for (int i = 0; ids && i < srv->dims.L; i++) json_array_append_new(ids, json_integer(ls_dims_layer_id(&srv->dims, i)));
    json_t *j = json_pack(
        "{s:o, s:{s:i, s:i, s:i, s:o, s:s, s:I, s:I}, s:{s:i, s:i, s:I, s:i, s:i}, s:{s:I, s:I, s:I, s:I, s:I}, s:s}",
        "slots", jslots, "capacity", "slots", st.slots, "max_rank", st.max_rank, "layers", st.layers, "layer_ids", ids,
        "layout",
        ls_lora_layout_name(st.layout), "bytes_per_slot", (json_int_t)st.bytes_per_slot, "bytes_total",
        (json_int_t)st.bytes_total, "host_cache", "capacity", st.host_capacity, "used", st.host_used, "bytes",
        (json_int_t)st.host_bytes, "registered", st.registered, "pinned", st.pinned, "counters", "loads",
        (json_int_t)st.loads, "evictions", (json_int_t)st.evictions, "hits", (json_int_t)st.hits, "misses",
        (json_int_t)st.misses, "host_drops", (json_int_t)st.host_drops, "backend", ls_backend_name(srv->backend));
    if (!j) ls_error_set(err, LS_INTERNAL, NULL, "out of memory describing the pool");
    return j;
}

json_t *ls_describe_model(const ls_server *srv, ls_error *err) {
    const ls_model *m = &srv->model;
    const ls_dims *d = &srv->dims;
    json_t *layers = json_array(), *files = json_array();
    for (int i = 0; layers && i < d->L; i++) json_array_append_new(layers, json_integer(ls_dims_layer_id(d, i)));
    for (int i = 0; files && i < m->n_files; i++) json_array_append_new(files, json_string(m->files[i]));
    json_t *j = json_pack("{s:s, s:s, s:o, s:o, s:i, s:i, s:i, s:o, s:i, s:s, s:s, s:b, s:b, s:s, s:o, s:I}", "source",
                          m->source, "family", m->family, "model_type", m->model_type[0] ? json_string(m->model_type) : json_null(),
                          "architecture", m->architecture[0] ? json_string(m->architecture) : json_null(), "n", d->n,
                          "hidden", d->H, "intermediate", d->F, "layers", layers, "layers_total",
                          ls_dims_layers_total(d), "layer_rule", m->rule, "dtype", ls_dtype_name(ls_backend_dtype(srv->backend)),
                          "gate", d->gate, "fp8_dequantized", m->fp8, "w13_layout", ls_w13_layout_name(d->w13_layout),
                          "files", files, "bytes", (json_int_t)m->bytes);
    if (!j) ls_error_set(err, LS_INTERNAL, NULL, "out of memory describing the model");
    return j;
}
