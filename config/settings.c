/* The settings table (README, Command line: name, type, bounds, default, help) and what
 * it drives directly: parsing one value, the defaults, --help and the dump
 * of the effective configuration. The sources are read in config.c. */
#include "config/settings.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/text.h"
static const char *const device_names[] = {"auto", "cpu", "cuda", NULL};
static const char *const dtype_names[] = {"auto", "bf16", "f16", "f32", NULL};
static const char *const w13_names[] = {"interleaved", "contiguous", NULL};
static const char *const lora_names[] = {"shared", "per-expert", NULL};

#define FIELD(f) .offset = offsetof(ls_config, f), .size = sizeof(((ls_config *)0)->f)
#define INT(g, n, f, lo, hi, d, h)                                                                 \
    { .name = n, .group = g, .type = LS_SET_INT, FIELD(f), .min = lo, .max = hi, .def = d, .meta = "N", .help = h }
#define U64(g, n, f, d, h) { .name = n, .group = g, .type = LS_SET_U64, FIELD(f), .def = d, .meta = "N", .help = h }
#define BOOL(g, n, f, d, h) { .name = n, .group = g, .type = LS_SET_BOOL, FIELD(f), .def = d, .meta = "", .help = h }
#define STR(g, n, f, minlen, d, m, h)                                                              \
    { .name = n, .group = g, .type = LS_SET_STR, FIELD(f), .min = minlen, .def = d, .meta = m, .help = h }
/* An enum field holds the index of its name in ch. */
#define ENUM(g, n, f, ch, d, h)                                                                    \
    { .name = n, .group = g, .type = LS_SET_ENUM, FIELD(f), .choices = ch, .def = d, .meta = "NAME", .help = h }

/* The listening address is bound as given, never looked up by name (a
 * name could resolve to another address on another day). */
static bool ls_host_check(const char *text, char *why, size_t len) {
    unsigned char addr[sizeof(struct in6_addr)];
    if (inet_pton(AF_INET, text, addr) == 1 || inet_pton(AF_INET6, text, addr) == 1) return true;
    snprintf(why, len,
             "is not a numeric IPv4 or IPv6 address: give 127.0.0.1 (this machine only), or 0.0.0.0 or :: (every "
             "interface)");
    return false;
}

/* Whether n bytes of e are a host name (letters, digits, '.', '-', '_'). */
static bool ls_allow_name_ok(const char *e, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)e[i];
        if (!(isalnum(c) || c == '.' || c == '-' || c == '_')) return false;
    }
    return n > 0 && n <= 253;
}

/* An origin's host[:port] (n bytes of e) after a scheme whose default
 * port is def: NULL when fine, else why not. A browser leaves the
 * default port out of Origin, so an entry naming it would never match. */
static const char *ls_allow_authority_why(const char *e, size_t n, unsigned def) {
    const char *end = e + n, *colon = NULL;
    if (n && e[0] == '[') {
        const char *close = memchr(e, ']', n);
        if (!close || close == e + 1) return "an IPv6 address goes in brackets, such as http://[::1]:8080";
        for (const char *c = e + 1; c < close; c++)
            if (!isxdigit((unsigned char)*c) && *c != ':' && *c != '.') return "is not an IPv6 address in brackets";
        colon = close + 1 < end ? close + 1 : NULL;
        if (colon && *colon != ':') return "holds something after its IPv6 address that is not :PORT";
    } else {
        colon = memchr(e, ':', n);
        if (!ls_allow_name_ok(e, (size_t)((colon ? colon : end) - e))) return "has no host name";
    }
    if (!colon) return NULL;
    unsigned port = 0;
    size_t digits = 0;
    for (const char *c = colon + 1; c < end; c++, digits++) {
        if (!isdigit((unsigned char)*c) || digits >= 5) return "has a port that is not a number from 1 to 65535";
        port = port * 10 + (unsigned)(*c - '0');
    }
    if (!digits || port < 1 || port > 65535) return "has a port that is not a number from 1 to 65535";
    if (port == def) return "names its scheme's default port, which browsers leave out of Origin: drop it";
    return NULL;
}

/* One entry of --allowed-hosts or --allowed-origins (n bytes of e):
 * "*", a host name, or with origins scheme://host[:port]. NULL when
 * fine, else why not. */
static const char *ls_allow_entry_why(const char *e, size_t n, bool origins) {
    if (n == 1 && e[0] == '*') return NULL;
    if (!origins) return ls_allow_name_ok(e, n) ? NULL : "is not a host name";
    const bool https = n > 8 && !strncmp(e, "https://", 8);
    if (!https && !(n > 7 && !strncmp(e, "http://", 7))) return "does not begin with http:// or https://";
    const size_t scheme = https ? 8 : 7;
    return ls_allow_authority_why(e + scheme, n - scheme, https ? 443 : 80);
}

/* A comma list of such entries ("" = none; no empty entry). */
static bool ls_allow_list_check(const char *text, bool origins, char *why, size_t len) {
    for (const char *e = text; *e;) {
        size_t n = strcspn(e, ",");
        const char *bad = n ? ls_allow_entry_why(e, n, origins) : "is empty (a comma too many)";
        if (!bad && e[n] == ',' && !e[n + 1]) e += n, n = 0, bad = "is empty (a comma too many)";
        if (bad) {
            /* Quoted like the whole value: the error stays one printable line. */
            char entry[128], q[88];
            snprintf(entry, sizeof entry, "%.*s", (int)(n < 120 ? n : 120), e);
            snprintf(why, len, "entry \"%s\" %s: %s", ls_setting_quote(entry, q, sizeof q), bad,
                     origins ? "give a comma list of origins such as https://ui.example.com:8443 (no path), or *"
                             : "give a comma list of host names such as lorasink.internal (no port), or *");
            return false;
        }
        e += n;
        if (*e) e++;
    }
    return true;
}

static bool ls_hosts_check(const char *text, char *why, size_t len) { return ls_allow_list_check(text, false, why, len); }
static bool ls_origins_check(const char *text, char *why, size_t len) { return ls_allow_list_check(text, true, why, len); }

const ls_setting ls_settings[] = {
    {.name = "host", .group = LS_GROUP_HTTP, .type = LS_SET_STR, FIELD(host), .min = 1, .def = "127.0.0.1", .meta = "ADDR",
     .help = "address to listen on (numeric IPv4 or IPv6)", .check = ls_host_check},
    INT(LS_GROUP_HTTP, "port", port, 0, 65535, "8080", "TCP port; 0 binds an ephemeral port and prints it"),
    ENUM(LS_GROUP_MODEL, "device", device, device_names, "auto", "backend: auto takes CUDA when a device is present"),
    INT(LS_GROUP_MODEL, "threads", threads, 0, 1024, "0", "CPU engine threads; 0 = every CPU the process may use"),
    ENUM(LS_GROUP_MODEL, "cpu-isa", cpu_isa, ls_cpu_isa_names, "auto",
         "CPU kernels: auto = the widest this CPU runs; every choice gives the same bits"),
    ENUM(LS_GROUP_MODEL, "compute", compute, ls_cpu_compute_names, "f32",
         "CPU arithmetic: f32, or bf16 operands with fp32 sums (VDPBF16PS where the CPU has AVX512-BF16, emulated "
         "bit for bit elsewhere; docs/math.md); the CUDA backend ignores it"),
    INT(LS_GROUP_MODEL, "cuda-graphs", cuda_graphs, 0, 65536, "256",
        "CUDA: forward shapes (layer, tokens, adapters) replayed as captured graphs once seen twice; 0 = none"),
    STR(LS_GROUP_MODEL, "weights", weights, 0, "", "PATH",
        "base weights: a Hugging Face checkpoint directory (config.json and model.safetensors or the "
        "model.safetensors.index.json of its shards), that index, the fused safetensors file, or a repo id ORG/NAME "
        "in the Hugging Face hub cache (never downloaded); turns --demo off"),
    BOOL(LS_GROUP_MODEL, "demo", demo, "true", "serve a deterministic demo model built from --seed and the sizes below"),
    INT(LS_GROUP_MODEL, "experts", experts, 1, 64, "2", "demo model: shared experts n"),
    INT(LS_GROUP_MODEL, "hidden", hidden, 1, 65536, "1024", "demo model: hidden size H"),
    INT(LS_GROUP_MODEL, "intermediate", intermediate, 1, 65536, "512", "demo model: intermediate size F per expert"),
    INT(LS_GROUP_MODEL, "layers", layers, 1, 1024, "2", "demo model: layers L"),
    U64(LS_GROUP_MODEL, "seed", seed, "42", "demo model: random seed"),
    {.name = "w13-layout", .group = LS_GROUP_MODEL, .type = LS_SET_ENUM, FIELD(w13_layout), .choices = w13_names, .def = "interleaved",
     .meta = "NAME",
     .help = "row layout of the fused weights file's W13: contiguous (gate rows, then up rows: sglang's and "
             "vLLM's FusedMoE) or interleaved; overrides the file's __metadata__ w13_layout, and a file "
             "without one needs it (null in a config file); a checkpoint's is contiguous",
     .marks = true, .mark_offset = offsetof(ls_config, w13_layout_set)},
    ENUM(LS_GROUP_MODEL, "dtype", dtype, dtype_names, "auto",
         "weight dtype; auto = the stored one (f32 when the tensors' differ, bf16 for FP8 blocks), bf16 for the "
         "demo model"),
    INT(LS_GROUP_POOL, "slots", slots, 1, 1024, "8", "adapter slots in the pool (S)"),
    INT(LS_GROUP_POOL, "max-rank", max_rank, 1, 1024, "64", "largest adapter rank a slot holds (R)"),
    ENUM(LS_GROUP_POOL, "lora-layout", lora_layout, lora_names, "shared", "pool layout of the outer LoRA factors"),
    INT(LS_GROUP_POOL, "host-cache", host_cache, 1, 100000, "64", "adapters kept in host memory"),
    STR(LS_GROUP_ADAPTERS, "adapter-dir", adapter_dir, 0, "", "DIR", "root of adapter paths; \"\" = the working directory"),
    {.name = "adapter", .group = LS_GROUP_ADAPTERS, .key = "adapters", .type = LS_SET_LIST, FIELD(adapters), .def = "", .meta = "NAME=PATH",
     .help = "load the adapter at PATH (beneath --adapter-dir) as NAME before serving (TENANT/NAME: a tenant's); "
             "\",pinned\" pins it; repeatable; the variable and the file's list take several, ';'-separated"},
    BOOL(LS_GROUP_ADAPTERS, "auto-load", auto_load, "false",
         "a forward naming an unregistered adapter found in --adapter-dir as NAME/ or NAME.safetensors loads it"),
    STR(LS_GROUP_ADAPTERS, "state-dir", state_dir, 0, "", "DIR",
        "keep every acknowledged adapter here and restore them at start; \"\" = none"),
    BOOL(LS_GROUP_ADAPTERS, "strict-adapters", strict_adapters, "false", "reject adapter tensors of modules not served"),
    INT(LS_GROUP_LIMITS, "max-adapter-mb", max_adapter_mb, 1, 1048576, "4096",
        "largest adapter file read from --adapter-dir, MiB; checked from its size before any read (413 past it)"),
    INT(LS_GROUP_LIMITS, "max-body-mb", max_body_mb, 1, 65536, "256", "largest request body in MiB"),
    {.name = "api-key", .group = LS_GROUP_HTTP, .type = LS_SET_STR, FIELD(api_key), .def = "", .meta = "KEY",
     .help = "require Authorization: Bearer KEY; \"\" = no auth", .secret = true},
    STR(LS_GROUP_HTTP, "tls-cert", tls_cert, 0, "", "FILE",
        "serve HTTPS (TLS 1.2 and 1.3 only) with this PEM certificate chain, the server's first; needs --tls-key; "
        "re-read when the file changes"),
    STR(LS_GROUP_HTTP, "tls-key", tls_key, 0, "", "FILE", "the PEM private key of --tls-cert (unencrypted)"),
    STR(LS_GROUP_HTTP, "tls-client-ca", tls_client_ca, 0, "", "FILE",
        "require a client certificate issued by one of these PEM CA certificates (the handshake fails "
        "without one); needs --tls-cert"),
    STR(LS_GROUP_HTTP, "api-keys", api_keys, 0, "", "FILE",
        "JSON file of API keys per tenant, stored as SHA-256 hashes, with roles and quotas (docs/api.md); re-read "
        "when it changes; \"\" = none"),
    INT(LS_GROUP_POOL, "max-batch-tokens", max_batch_tokens, 1, 1048576, "4096", "tokens of one batched forward call"),
    INT(LS_GROUP_POOL, "batch-wait-us", batch_wait_us, 0, 1000000, "200",
        "longest wait to fill a batch, microseconds (only while more requests are likely)"),
    INT(LS_GROUP_LIMITS, "max-queue-tokens", max_queue_tokens, 1, 16777216, "65536", "tokens waiting in the batch queue"),
    INT(LS_GROUP_LIMITS, "max-request-tokens", max_request_tokens, 1, 16777216, "16384",
        "tokens of one forward request, checked while x is read (413 past it)"),
    INT(LS_GROUP_LIMITS, "max-queue-mb", max_queue_mb, 1, 1048576, "1024",
        "MiB that forward requests may hold at once (bodies as they arrive, x, gammas, y); 429 past it"),
    INT(LS_GROUP_LIMITS, "max-upload-mb", max_upload_mb, 1, 1048576, "2048",
        "MiB that other requests' bodies (adapter uploads, validations) may hold at once, from their first byte "
        "until answered; 429 past it"),
    BOOL(LS_GROUP_POOL, "batching", batching, "true", "coalesce concurrent /forward requests into one backend call"),
    INT(LS_GROUP_HTTP, "http-threads", http_threads, 1, 1024, "4", "threads serving HTTP connections; as many offload workers for adapter loads, and for validations"),
    INT(LS_GROUP_LIMITS, "max-connections", max_connections, 1, 65536, "1024", "open HTTP connections"),
    INT(LS_GROUP_LIMITS, "per-ip-connections", per_ip_connections, 0, 65536, "256", "connections per client IP; 0 = unlimited"),
    INT(LS_GROUP_LIMITS, "connection-timeout", connection_timeout_s, 1, 86400, "60", "idle connection timeout, seconds"),
    INT(LS_GROUP_LIMITS, "request-timeout", request_timeout_s, 1, 86400, "60",
        "seconds from a request's first byte to the end of its head; past it 408 and the connection closed"),
    INT(LS_GROUP_LIMITS, "body-timeout", body_timeout_s, 1, 86400, "300",
        "seconds from the end of a request's head to the end of its body; past it 408 and the connection closed"),
    {.name = "allowed-hosts", .group = LS_GROUP_HTTP, .type = LS_SET_STR, FIELD(allowed_hosts), .def = "", .meta = "NAMES",
     .help = "comma list of names the Host header may carry besides IP addresses and localhost (DNS rebinding); "
             "* = any",
     .check = ls_hosts_check},
    {.name = "allowed-origins", .group = LS_GROUP_HTTP, .type = LS_SET_STR, FIELD(allowed_origins), .def = "", .meta = "ORIGINS",
     .help = "comma list of origins (https://host:port) besides the server's own whose pages may send requests; "
             "* = any",
     .check = ls_origins_check},
    INT(LS_GROUP_OPS, "shutdown-timeout", shutdown_timeout_s, 0, 86400, "30",
        "on SIGTERM, seconds to wait for clients still sending or reading before closing them; a reply the server "
        "still owes (a request queued or running) is always finished and sent"),
    ENUM(LS_GROUP_OPS, "log-level", log_level, ls_log_level_names, "info", "least severe level logged"),
    BOOL(LS_GROUP_OPS, "access-log", access_log, "true", "one stderr line per request: time, request id, method, path, status, "
                                          "bytes, microseconds"),
};

const size_t ls_settings_count = sizeof ls_settings / sizeof ls_settings[0];
_Static_assert(sizeof ls_settings / sizeof ls_settings[0] <= LS_SETTINGS_MAX, "raise LS_SETTINGS_MAX");

/* Static strings, never freed. */
const char *ls_device_kind_name(ls_device_kind d) {
    return (unsigned)d <= (unsigned)LS_DEVICE_CUDA ? device_names[d] : "unknown";
}

const char *ls_weight_dtype_name(ls_weight_dtype d) {
    return (unsigned)d <= (unsigned)LS_WDTYPE_F32 ? dtype_names[d] : "unknown";
}

/* ---- names derived from the table ---------------------------------------- */

/* "LORASINK_MAX_RANK" for "max-rank", into the caller's buf (truncated to len). */
void ls_env_name_of(const char *name, char *buf, size_t len) {
    size_t n = (size_t)snprintf(buf, len, "LORASINK_%s", name);
    for (size_t i = 0; i < n && i < len; i++)
        buf[i] = buf[i] == '-' ? '_' : (char)toupper((unsigned char)buf[i]);
}

void ls_setting_env_name(const ls_setting *s, char *buf, size_t len) { ls_env_name_of(s->key ? s->key : s->name, buf, len); }

/* Likewise: "max_rank" for "max-rank". */
void ls_setting_json_key(const ls_setting *s, char *buf, size_t len) {
    snprintf(buf, len, "%s", s->key ? s->key : s->name);
    for (char *p = buf; *p; p++)
        if (*p == '-') *p = '_';
}

/* By flag name (len bytes, not NUL-terminated); the entry is static, NULL
 * when nothing matches. */
const ls_setting *ls_setting_find_flag(const char *name, size_t len) {
    for (size_t i = 0; i < ls_settings_count; i++)
        if (strlen(ls_settings[i].name) == len && !memcmp(ls_settings[i].name, name, len)) return &ls_settings[i];
    return NULL;
}

/* By JSON key; the entry is static, NULL when nothing matches. */
const ls_setting *ls_setting_find_key(const char *key) {
    char k[64];
    for (size_t i = 0; i < ls_settings_count; i++) {
        ls_setting_json_key(&ls_settings[i], k, sizeof k);
        if (!strcmp(k, key)) return &ls_settings[i];
    }
    return NULL;
}

/* A user's text quoted in an error: short and on one line whatever it holds,
 * so the error stays the promised single line. */
const char *ls_setting_quote(const char *text, char *buf, size_t len) {
    size_t keep = len - 4, i = 0;
    for (; text[i] && i < keep; i++)
        buf[i] = isprint((unsigned char)text[i]) ? text[i] : '?';
    buf[i] = '\0';
    if (text[i]) strcat(buf, "...");
    return buf;
}

/* ---- values --------------------------------------------------------------- */

static int load_int(const ls_config *cfg, const ls_setting *s) {
    int v;
    memcpy(&v, (const char *)cfg + s->offset, sizeof v);
    return v;
}

static void store_int(ls_config *cfg, const ls_setting *s, int v) {
    memcpy((char *)cfg + s->offset, &v, sizeof v);
}

/* Decimal digits and nothing else (an optional '-' when sign is true):
 * strto* alone would skip leading blanks, stop early at "12abc" and take
 * "+" and, with base 0, hex. */
static bool all_digits(const char *t, bool sign) {
    if (sign && *t == '-') t++;
    if (!*t) return false;
    for (; *t; t++)
        if (!isdigit((unsigned char)*t)) return false;
    return true;
}

static int choice_index(const char *const *choices, const char *t) {
    for (int i = 0; choices[i]; i++)
        if (!strcmp(choices[i], t)) return i;
    return -1;
}

static void choice_list(const char *const *choices, const char *sep, char *buf, size_t len) {
    buf[0] = '\0';
    for (int i = 0; choices[i]; i++) {
        size_t used = strlen(buf);
        snprintf(buf + used, len - used, "%s%s", i ? sep : "", choices[i]);
    }
}

/* Whether s[n] is UTF-8 (RFC 3629: no overlong forms, no surrogates,
 * nothing past U+10FFFF). */
static bool ls_utf8_valid(const char *text, size_t n) {
    const unsigned char *s = (const unsigned char *)text;
    for (size_t i = 0; i < n;) {
        const unsigned c = s[i];
        const size_t k = c < 0x80                  ? 1
                         : c >= 0xc2 && c <= 0xdf ? 2
                         : c >= 0xe0 && c <= 0xef ? 3
                         : c >= 0xf0 && c <= 0xf4 ? 4
                                                  : 0;
        if (!k || i + k > n) return false;
        for (size_t j = 1; j < k; j++)
            if ((s[i + j] & 0xc0) != 0x80) return false;
        if (k == 3 && ((c == 0xe0 && s[i + 1] < 0xa0) || (c == 0xed && s[i + 1] > 0x9f))) return false;
        if (k == 4 && ((c == 0xf0 && s[i + 1] < 0x90) || (c == 0xf4 && s[i + 1] > 0x8f))) return false;
        i += k;
    }
    return true;
}

/* The suffix that pins a start-up adapter. */
static const char ls_pinned_suffix[] = ",pinned";

/* Splits one entry "NAME=PATH[,pinned]" (len bytes of e) into out; false
 * with the reason in why when it is not of that form. */
static bool ls_adapter_entry_split(const char *e, size_t len, ls_config_adapter *out, const char **why) {
    const char *eq = memchr(e, '=', len);
    const size_t suffix = sizeof ls_pinned_suffix - 1;
    out->pinned = len > suffix && !memcmp(e + len - suffix, ls_pinned_suffix, suffix);
    const size_t end = out->pinned ? len - suffix : len;
    if (!eq || eq == e || (size_t)(eq - e) >= end) {
        *why = "is not NAME=PATH[,pinned]";
        return false;
    }
    const size_t nlen = (size_t)(eq - e), plen = end - nlen - 1;
    if (nlen >= sizeof out->name) {
        *why = "has a name longer than 128 bytes";
        return false;
    }
    if (plen == 0 || plen >= sizeof out->path) {
        *why = plen ? "has a path longer than 4095 bytes" : "has an empty path";
        return false;
    }
    memcpy(out->name, e, nlen);
    out->name[nlen] = '\0';
    if (!ls_adapter_pool_name_valid(out->name)) {
        *why = "has a name that is not NAME or TENANT/NAME (a tenant's adapter): NAME 1-128 letters, digits, '.', "
               "'_' or '-' (not starting with '.'), TENANT 1-32 lowercase letters, digits, '_' or '-', 128 bytes "
               "in all";
        return false;
    }
    /* A path is shown as the adapter's source in GET /adapters and saved
     * in its state record, both JSON, whose strings are UTF-8. */
    if (!ls_utf8_valid(eq + 1, plen)) {
        *why = "has a path that is not UTF-8 (it is shown in GET /adapters and saved in the state directory as JSON "
               "text); rename the file";
        return false;
    }
    memcpy(out->path, eq + 1, plen);
    out->path[plen] = '\0';
    /* "A,pined" would be looked for as a file of that name. */
    const char *comma = strrchr(out->path, ',');
    if (!out->pinned && comma && ls_text_distance(comma + 1, ls_pinned_suffix + 1, 2) <= 2) {
        *why = "ends in a ',' and a near miss of \"pinned\": write NAME=PATH,pinned to pin it";
        return false;
    }
    return true;
}

/* See config.h; the field holds checked entries, one per line. */
bool ls_config_adapter_next(const char **cursor, ls_config_adapter *out) {
    const char *e = *cursor;
    if (!e || !*e) return false;
    const char *nl = strchr(e, '\n');
    size_t len = nl ? (size_t)(nl - e) : strlen(e);
    const char *why;
    *cursor = nl ? nl + 1 : e + len;
    return ls_adapter_entry_split(e, len, out, &why);
}

void ls_setting_list_clear(const ls_setting *s, ls_config *cfg) {
    ((char *)cfg + s->offset)[0] = '\0';
}

/* Appends the ';'- or newline-separated entries of text to the list field;
 * empty entries (a trailing ';') are skipped. */
static bool ls_setting_list_append(const ls_setting *s, const char *text, ls_config *cfg, const char *origin,
                                   char *err, size_t errlen) {
    char *field = (char *)cfg + s->offset;
    size_t used = strlen(field);
    for (const char *e = text; *e;) {
        size_t len = strcspn(e, ";\n");
        if (len) {
            ls_config_adapter a;
            const char *why;
            char q[48], entry[160];
            if (!ls_adapter_entry_split(e, len, &a, &why)) {
                snprintf(entry, sizeof entry, "%.*s", (int)(len < 150 ? len : 150), e);
                snprintf(err, errlen, "%s: \"%s\" %s", origin, ls_setting_quote(entry, q, sizeof q), why);
                return false;
            }
            /* One name twice would load the second over the first as
             * version 2: surely a mistake, and which path wins would
             * depend on the order of the sources. */
            ls_config_adapter prev;
            for (const char *c = field; ls_config_adapter_next(&c, &prev);)
                if (!strcmp(prev.name, a.name)) {
                    snprintf(err, errlen, "%s: adapter \"%s\" is given twice", origin,
                             ls_setting_quote(a.name, q, sizeof q));
                    return false;
                }
            if (used + len + 2 > s->size) {
                snprintf(err, errlen, "%s: the adapters take more than %zu bytes", origin, s->size - 1);
                return false;
            }
            if (used) field[used++] = '\n';
            memcpy(field + used, e, len);
            used += len;
            field[used] = '\0';
        }
        e += len;
        if (*e) e++;
    }
    return true;
}

/* An integer setting (LS_SET_INT within [min, max], or LS_SET_U64) from
 * its digits; shown is text as an error may quote it. */
static bool ls_setting_parse_number(const ls_setting *s, const char *text, const char *shown, ls_config *cfg,
                                    const char *origin, char *err, size_t errlen) {
    const bool is_int = s->type == LS_SET_INT;
    if (!all_digits(text, is_int)) {
        snprintf(err, errlen, "%s: \"%s\" is not an %s", origin, shown, is_int ? "integer" : "unsigned integer");
        return false;
    }
    errno = 0;
    if (!is_int) {
        uint64_t u = strtoull(text, NULL, 10);
        if (errno == ERANGE) {
            snprintf(err, errlen, "%s: %s is out of range [0, %llu]", origin, shown, (unsigned long long)UINT64_MAX);
            return false;
        }
        memcpy((char *)cfg + s->offset, &u, sizeof u);
        return true;
    }
    long long v = strtoll(text, NULL, 10);
    if (errno == ERANGE || v < s->min || v > s->max) {
        snprintf(err, errlen, "%s: %s is out of range [%lld, %lld]", origin, shown, s->min, s->max);
        return false;
    }
    store_int(cfg, s, (int)v);
    return true;
}

/* A string setting: one of its choices when it has them, within its
 * field, non-empty when min says so, and past its own check. */
static bool ls_setting_parse_str(const ls_setting *s, const char *text, const char *shown, ls_config *cfg,
                                 const char *origin, char *err, size_t errlen) {
    char list[96], why[160];
    size_t n = strlen(text);
    if (s->choices && choice_index(s->choices, text) < 0) {
        choice_list(s->choices, ", ", list, sizeof list);
        snprintf(err, errlen, "%s: \"%s\" is not one of %s", origin, shown, list);
        return false;
    }
    /* The value itself stays out of these two: it may be the API key. */
    if (n >= s->size) {
        snprintf(err, errlen, "%s: value is longer than %zu bytes", origin, s->size - 1);
        return false;
    }
    if ((long long)n < s->min) {
        snprintf(err, errlen, "%s: value must not be empty", origin);
        return false;
    }
    if (s->check && !s->check(text, why, sizeof why)) {
        snprintf(err, errlen, "%s: \"%s\" %s", origin, shown, why);
        return false;
    }
    memcpy((char *)cfg + s->offset, text, n + 1);
    return true;
}

/* Parses text for setting s into its field of cfg (the caller's); origin names where it came from
 * ("--slots", "LORASINK_SLOTS", "file.json: slots") in the error. */
bool ls_setting_parse(const ls_setting *s, const char *text, ls_config *cfg, const char *origin, char *err,
                      size_t errlen) {
    char q[48], list[96];
    const char *shown = ls_setting_quote(text, q, sizeof q);
    switch (s->type) {
    case LS_SET_INT:
    case LS_SET_U64: return ls_setting_parse_number(s, text, shown, cfg, origin, err, errlen);
    case LS_SET_BOOL: {
        bool b;
        if (!ls_text_bool(text, &b)) {
            snprintf(err, errlen, "%s: \"%s\" is not a boolean (true, false, 1 or 0)", origin, shown);
            return false;
        }
        memcpy((char *)cfg + s->offset, &b, sizeof b);
        return true;
    }
    case LS_SET_ENUM: {
        int i = choice_index(s->choices, text);
        if (i < 0) {
            choice_list(s->choices, ", ", list, sizeof list);
            snprintf(err, errlen, "%s: \"%s\" is not one of %s", origin, shown, list);
            return false;
        }
        store_int(cfg, s, i);
        return true;
    }
    case LS_SET_STR: return ls_setting_parse_str(s, text, shown, cfg, origin, err, errlen);
    case LS_SET_LIST: return ls_setting_list_append(s, text, cfg, origin, err, errlen);
    }
    return false;
}

static size_t field_size_of(ls_setting_type t) {
    switch (t) {
    case LS_SET_INT:
    case LS_SET_ENUM: return sizeof(int);
    case LS_SET_U64: return sizeof(uint64_t);
    case LS_SET_BOOL: return sizeof(bool);
    case LS_SET_STR:
    case LS_SET_LIST: return 0;
    }
    return 0;
}

/* The defaults go through the same parser as user values, so a default
 * outside its own bounds, or a field whose size does not fit its type, is
 * caught by the first load (and by the unit test of the defaults). */
/* cfg is the caller's, zeroed first. */
bool ls_setting_defaults(ls_config *cfg, char *err, size_t errlen) {
    memset(cfg, 0, sizeof *cfg);
    for (size_t i = 0; i < ls_settings_count; i++) {
        const ls_setting *s = &ls_settings[i];
        char origin[80];
        snprintf(origin, sizeof origin, "internal: default of --%s", s->name);
        size_t want = field_size_of(s->type);
        if (want && want != s->size) {
            snprintf(err, errlen, "%s: field size %zu does not fit its type", origin, s->size);
            return false;
        }
        if (!ls_setting_parse(s, s->def, cfg, origin, err, errlen)) return false;
    }
    return true;
}

/* ---- aliases --------------------------------------------------------------- */

/* vLLM's and sglang's names for the same knobs (docs/configuration.md,
 * Aliases, says where the meaning differs). */
static const char *const vllm_keys[] = {"name", "path", "base_model_name", "is_3d_lora_weight", "pinned", NULL};
static const char *const sglang_keys[] = {"lora_name", "lora_path", "pinned", NULL};
static const ls_peer_entry vllm_entry = {"name", "path", vllm_keys, false};
static const ls_peer_entry sglang_entry = {"lora_name", "lora_path", sglang_keys, true};

const ls_flag_alias ls_flag_aliases[] = {
    {"max-loras", "slots", "N", "vLLM's name for --slots", false, "vLLM", NULL},
    {"max-loras-per-batch", "slots", "N", "sglang's name for --slots", false, "sglang", NULL},
    {"max-lora-rank", "max-rank", "N", "vLLM's name for --max-rank (any rank in its range, not only vLLM's)", false, "vLLM", NULL},
    {"lora-modules", "adapter", "NAME=PATH...", "vLLM's name for --adapter, one or more entries (NAME=PATH or vLLM's JSON form)", true, "vLLM", &vllm_entry},
    {"lora-paths", "adapter", "NAME=PATH...", "sglang's name for --adapter, one or more entries (NAME=PATH, NAME, or sglang's JSON form)", true, "sglang", &sglang_entry},
    {"max-cpu-loras", "host-cache", "N", "vLLM's name for --host-cache", false, "vLLM", NULL},
};
const size_t ls_flag_aliases_count = sizeof ls_flag_aliases / sizeof ls_flag_aliases[0];

/* Peers' flags with no counterpart here: refused as unknown like any
 * other, with what to do instead. */
const ls_peer_flag ls_peer_flags[] = {
    {"enable-lora", "vLLM's and sglang's", "lorasink always serves LoRA adapters: drop it"},
    {"model", "vLLM's", "give the checkpoint with --weights (a directory, or ORG/NAME in the Hugging Face hub cache)"},
    {"model-path", "sglang's", "give the checkpoint with --weights (a directory, or ORG/NAME in the Hugging Face hub "
                               "cache)"},
    {"max-loaded-loras", "sglang's", "the adapters kept in host memory are --host-cache N; use it"},
    {"lora-target-modules", "sglang's", "each adapter's own target modules are read from it: drop it"},
    {"lora-backend", "sglang's", "the kernels are the backend's (--device): drop it"},
    {"lora-eviction-policy", "sglang's", "the least recently used unpinned adapter is evicted: drop it"},
    {"lora-dtype", "vLLM's", "factors are computed at the backend's dtype (--compute on the CPU): drop it"},
    {"fully-sharded-loras", "vLLM's", "one server holds the whole block: drop it"},
};
const size_t ls_peer_flags_count = sizeof ls_peer_flags / sizeof ls_peer_flags[0];

const ls_flag_alias *ls_flag_alias_find(const char *name, size_t len) {
    for (size_t i = 0; i < ls_flag_aliases_count; i++)
        if (strlen(ls_flag_aliases[i].name) == len && !memcmp(ls_flag_aliases[i].name, name, len))
            return &ls_flag_aliases[i];
    return NULL;
}

/* ---- help and dump -------------------------------------------------------- */

#define LS_HELP_WIDTH 100
#define LS_HELP_INDENT 26

static const char *const ls_group_titles[LS_GROUP_COUNT] = {
    "Model and compute", "Pool and batching", "Adapters", "HTTP", "Limits", "Operations"};

/* "  --flag META" and text wrapped at word boundaries to the help width,
 * its lines after the first indented to the text's column. */
static void ls_help_entry(FILE *out, const char *flag, const char *text) {
    const int room = LS_HELP_WIDTH - LS_HELP_INDENT;
    int col = fprintf(out, "  %s", flag);
    if (col > LS_HELP_INDENT - 1) {
        fputc('\n', out);
        col = 0;
    }
    fprintf(out, "%*s", LS_HELP_INDENT - col, "");
    for (const char *p = text; *p;) {
        int n = (int)strlen(p);
        if (n > room) {
            n = room;
            while (n > 0 && p[n] != ' ') n--;
            if (n == 0) n = room; /* one word wider than the column: cut it */
        }
        fprintf(out, "%.*s\n", n, p);
        p += n;
        while (*p == ' ') p++;
        if (*p) fprintf(out, "%*s", LS_HELP_INDENT, "");
    }
}

/* One setting: its help, then its default and range. */
static void ls_help_setting(FILE *out, const ls_setting *s) {
    char flag[64], range[96], text[700];
    snprintf(flag, sizeof flag, "--%s%s%s", s->name, s->meta[0] ? " " : "", s->meta);
    switch (s->type) {
    case LS_SET_INT: snprintf(range, sizeof range, "[%lld, %lld]", s->min, s->max); break;
    case LS_SET_U64: snprintf(range, sizeof range, "[0, 2^64-1]"); break;
    case LS_SET_BOOL: snprintf(range, sizeof range, "true|false"); break;
    case LS_SET_ENUM: choice_list(s->choices, "|", range, sizeof range); break;
    case LS_SET_STR:
        if (s->choices) choice_list(s->choices, "|", range, sizeof range);
        else snprintf(range, sizeof range, "at most %zu bytes", s->size - 1);
        break;
    case LS_SET_LIST: snprintf(range, sizeof range, "repeatable"); break;
    }
    char env[64];
    ls_setting_env_name(s, env, sizeof env);
    snprintf(text, sizeof text, s->def[0] ? "%s (default %s; %s; %s)" : "%s (default \"%s\"; %s; %s)", s->help,
             s->def, range, env);
    ls_help_entry(out, flag, text);
    for (size_t i = 0; i < ls_flag_aliases_count; i++)
        if (!strcmp(ls_flag_aliases[i].target, s->name)) {
            snprintf(flag, sizeof flag, "--%s %s", ls_flag_aliases[i].name, ls_flag_aliases[i].meta);
            ls_help_entry(out, flag, ls_flag_aliases[i].note);
        }
}

/* Writes to out; nothing to free. */
void ls_settings_help(FILE *out) {
    fprintf(out, "usage: lorasink [--config FILE.json] [--NAME VALUE | --NAME=VALUE]...\n\n"
                 "Every setting is a flag, an environment variable LORASINK_NAME and a key of the JSON config\n"
                 "file (the flag's name with '_' for '-'; --adapter's are LORASINK_ADAPTERS and \"adapters\").\n"
                 "Precedence: flag > environment > file > default. A boolean flag alone means true; give\n"
                 "false as --NAME=false (not --NAME false). Aliases are flags only.\n");
    for (int g = 0; g < LS_GROUP_COUNT; g++) {
        fprintf(out, "\n%s:\n", ls_group_titles[g]);
        if (g == LS_GROUP_OPS) {
            ls_help_entry(out, "--config FILE.json", "JSON config file, an object (env LORASINK_CONFIG)");
            ls_help_entry(out, "--help, -h", "print this and exit");
            ls_help_entry(out, "--version, -V", "print the version and exit");
            ls_help_entry(out, "--probe", "ask the server these settings describe for GET /ready (HTTPS with --tls-cert) "
                                          "and exit 0 on 200, else 1: a container's health check");
        }
        for (size_t i = 0; i < ls_settings_count; i++)
            if (ls_settings[i].group == (ls_setting_group)g) ls_help_setting(out, &ls_settings[i]);
    }
}

bool ls_setting_demo_only(const ls_setting *s) {
    static const char *const demo_only[] = {"experts", "hidden", "intermediate", "layers", "seed"};
    for (size_t i = 0; i < sizeof demo_only / sizeof demo_only[0]; i++)
        if (!strcmp(s->name, demo_only[i])) return true;
    return false;
}

/* cfg is only read; one line goes to out. Only the table's settings, so the
 * dump has the shape of a config file. */
void ls_config_dump(const ls_config *cfg, FILE *out) {
    json_t *o = json_object();
    if (!o) return;
    for (size_t i = 0; i < ls_settings_count; i++) {
        const ls_setting *s = &ls_settings[i];
        const char *field = (const char *)cfg + s->offset;
        char k[64];
        ls_setting_json_key(s, k, sizeof k);
        json_t *v = NULL;
        if (!cfg->demo && ls_setting_demo_only(s)) {
            /* null: not given, so the dump of a checkpoint's config loads
             * back (a demo size beside --weights is refused). */
            json_object_set_new(o, k, json_null());
            continue;
        }
        switch (s->type) {
        case LS_SET_INT: v = json_integer(load_int(cfg, s)); break;
        case LS_SET_U64: {
            uint64_t u;
            memcpy(&u, field, sizeof u);
            char num[32];
            snprintf(num, sizeof num, "%llu", (unsigned long long)u);
            /* Above 2^63-1 as a string, the form the file loader accepts. */
            v = u <= (uint64_t)INT64_MAX ? json_integer((json_int_t)u) : json_string(num);
            break;
        }
        case LS_SET_BOOL: {
            bool b;
            memcpy(&b, field, sizeof b);
            v = json_boolean(b);
            break;
        }
        case LS_SET_ENUM: {
            int e = load_int(cfg, s), n = 0;
            while (s->choices[n]) n++;
            v = json_string(e >= 0 && e < n ? s->choices[e] : "unknown");
            break;
        }
        case LS_SET_STR: v = json_string(s->secret && field[0] ? "***" : field); break;
        case LS_SET_LIST: {
            /* The file's form: one string per entry. */
            v = json_array();
            for (const char *e = field; v && *e;) {
                size_t len = strcspn(e, "\n");
                json_array_append_new(v, json_stringn(e, len));
                e += len + (e[len] != '\0');
            }
            break;
        }
        }
        if (!v) v = json_string("<not UTF-8>"); /* a path may be any bytes; JSON strings may not */
        json_object_set_new(o, k, v);
    }
    json_dumpf(o, out, JSON_PRESERVE_ORDER);
    fputc('\n', out);
    json_decref(o);
}

