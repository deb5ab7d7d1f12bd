/* The JSON /forward body, read in one pass (format/json_reader.h): x and
 * gammas given as nested arrays go straight into floats, so a forward's
 * peak memory is its body plus 4 bytes a number (at most twice the body:
 * every number takes 2 or more bytes of it) instead of a JSON value per
 * number; x stops at --max-request-tokens rows before more is built. A
 * syntax error anywhere wins over every other problem (as when the body
 * was parsed whole first); the rest are reported in the order layer,
 * encoding, x, gammas, names. */
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/forward.h"
#include "api/forward_internal.h"
#include "format/json_reader.h"
#include "api/json_tensor.h"
#include "common/text.h"

/* A problem with one field, kept until the whole body is known to be
 * well formed. */
typedef struct {
    ls_status st;
    char message[256];
    char hint[160];
} ls_fj_problem;

static void ls_fj_note(ls_fj_problem *p, ls_status st, const char *hint, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void ls_fj_note(ls_fj_problem *p, ls_status st, const char *hint, const char *fmt, ...) {
    if (p->st != LS_OK) return;
    p->st = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->message, sizeof p->message, fmt, ap);
    va_end(ap);
    snprintf(p->hint, sizeof p->hint, "%s", hint ? hint : "");
}

/* Moves a noted problem into err. */
static ls_status ls_fj_raise(const ls_fj_problem *p, ls_error *err) {
    return ls_error_set(err, p->st, p->hint[0] ? p->hint : NULL, "%s", p->message);
}

/* A [rows][cols] matrix of numbers read as floats. */
typedef struct {
    float *v;
    size_t count, cap; /* floats */
    int rows;
} ls_fj_matrix;

static bool ls_fj_push(ls_fj_matrix *m, float f) {
    if (m->count == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 1024;
        float *v = realloc(m->v, cap * sizeof *v);
        if (!v) return false;
        m->v = v, m->cap = cap;
    }
    m->v[m->count++] = f;
    return true;
}

/* Reads nested arrays [rows][cols] of numbers into m, noting the first
 * problem (and then only checking the syntax of the rest). max_rows > 0
 * stops reading rows past it. */
static bool ls_fj_nested(ls_jr *r, const char *what, int cols, int max_rows, ls_fj_matrix *m, ls_fj_problem *pb) {
    if (!ls_jr_punct(r, '[')) return false;
    r->depth++;
    if (ls_jr_peek(r) == ']') {
        ls_fj_note(pb, LS_INVALID_SHAPE, NULL, "%s is empty, expected [T, %d] with T >= 1", what, cols);
        r->depth--;
        return ls_jr_punct(r, ']');
    }
    do {
        if (ls_jr_peek(r) != '[') {
            /* A number or anything else at the top level: not 2-D. */
            if (ls_jr_peek(r) == '-' || (ls_jr_peek(r) >= '0' && ls_jr_peek(r) <= '9'))
                ls_fj_note(pb, LS_INVALID_SHAPE, NULL, "%s is one-dimensional, expected [T, %d]: a row per token",
                           what, cols);
            else
                ls_fj_note(pb, LS_INVALID_REQUEST, NULL, "%s: expected a row (an array of numbers)", what);
            if (!ls_jr_skip(r)) return false;
            continue;
        }
        r->p++; /* '[' of a row, as peeked */
        r->depth++;
        int row = m->rows, got = 0;
        bool keep = pb->st == LS_OK && (max_rows <= 0 || row < max_rows);
        if (pb->st == LS_OK && max_rows > 0 && row >= max_rows)
            ls_fj_note(pb, LS_PAYLOAD_TOO_LARGE, "send fewer tokens per request or restart with a larger --max-request-tokens",
                       "%s has more than %d rows, the most one request may carry", what, max_rows);
        if (ls_jr_peek(r) != ']') {
            do {
                char c = ls_jr_peek(r);
                if (c == '-' || (c >= '0' && c <= '9')) {
                    double d;
                    bool is_int;
                    long long iv;
                    if (!ls_jr_number(r, &d, &is_int, &iv)) return false;
                    float f = (float)d;
                    if (!isfinite(f))
                        ls_fj_note(pb, LS_INVALID_REQUEST, "send finite values", "%s[%d][%d] is not finite", what, row,
                                   got);
                    if (keep && pb->st == LS_OK && got < cols && !ls_fj_push(m, f))
                        ls_fj_note(pb, LS_INTERNAL, NULL, "%s: out of memory", what);
                } else {
                    ls_fj_note(pb, c == '[' ? LS_INVALID_SHAPE : LS_INVALID_REQUEST, NULL,
                               "%s[%d][%d]: expected a number, found %s", what, row, got,
                               c == '[' ? "an array (x is [T][H], two levels deep)" : "another JSON value");
                    if (!ls_jr_skip(r)) return false;
                }
                got++;
            } while (ls_jr_peek(r) == ',' && ls_jr_punct(r, ','));
        }
        if (!ls_jr_punct(r, ']')) return false;
        r->depth--;
        if (got != cols)
            ls_fj_note(pb, LS_INVALID_SHAPE,
                       "every row of a nested array has the width of the model: one row per token (an array sent "
                       "transposed has a row per feature)",
                       "%s row %d has %d value%s, expected %d", what, row, got, got == 1 ? "" : "s", cols);
        m->rows++;
    } while (ls_jr_peek(r) == ',' && ls_jr_punct(r, ','));
    r->depth--;
    return ls_jr_punct(r, ']');
}

/* The string at r into a new buffer of *len bytes and a NUL, the caller's
 * to free: measured, then read again. NULL when out of memory, or with r
 * failed on bad syntax. */
static char *ls_fj_string_dup(ls_jr *r, size_t *len) {
    const char *at = r->p;
    if (!ls_jr_string(r, NULL, 0, len)) return NULL;
    char *s = malloc(*len + 1);
    if (!s) return NULL;
    r->p = at;
    ls_jr_string(r, s, *len + 1, NULL);
    return s;
}

/* A JSON object, already checked by ls_jr_skip, as a new jansson object
 * (the caller's reference). Its strings are copied straight into jansson
 * strings: the data string of a base64 tensor is tens of kilobytes, and
 * letting jansson lex it took a quarter of a batched server's CPU on
 * H=4096 bodies. Other values are small and parsed from their text. NULL
 * with r failed on a repeated key (refused, as JSON_REJECT_DUPLICATES
 * refuses it), NULL alone when out of memory. */
static json_t *ls_fj_object(ls_jr *r) {
    json_t *o = json_object();
    if (!o) return NULL;
    ls_jr_punct(r, '{');
    if (ls_jr_peek(r) != '}') {
        do {
            size_t klen, vlen;
            char *key = ls_fj_string_dup(r, &klen);
            if (!key) goto fail;
            ls_jr_punct(r, ':');
            json_t *v = NULL;
            if (ls_jr_peek(r) == '"') {
                char *text = ls_fj_string_dup(r, &vlen);
                v = text ? json_stringn_nocheck(text, vlen) : NULL; /* UTF-8 checked by ls_jr_string */
                free(text);
            } else {
                const char *from = r->p;
                ls_jr_skip(r);
                json_error_t jerr;
                v = json_loadb(from, (size_t)(r->p - from), JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &jerr);
                /* The syntax is checked; jansson still refuses repeated
                 * keys and integers past 64 bits, as it did whole bodies.
                 * Any other failure is memory: jansson 2.14 often fails an
                 * allocation without saying so (json_error_unknown). */
                if (!v && (json_error_code(&jerr) == json_error_duplicate_key ||
                           json_error_code(&jerr) == json_error_numeric_overflow))
                    ls_jr_fail(r, jerr.text);
            }
            if (v && json_object_get(o, key)) {
                ls_jr_fail(r, "duplicate object key");
                json_decref(v);
                v = NULL;
            }
            int rc = v ? json_object_set_new_nocheck(o, key, v) : -1;
            free(key);
            if (rc) goto fail;
        } while (ls_jr_peek(r) == ',' && ls_jr_punct(r, ','));
    }
    if (ls_jr_punct(r, '}')) return o;
fail:
    json_decref(o);
    return NULL;
}

/* x or gammas: nested arrays (read straight into floats) or a base64
 * object (small but for its data: built as a JSON value, then checked as
 * any tensor). */
static bool ls_fj_tensor(ls_jr *r, const char *what, int rows, int cols, int max_rows, ls_fj_matrix *m,
                         ls_fj_problem *pb) {
    char c = ls_jr_peek(r);
    if (c == '[') return ls_fj_nested(r, what, cols, max_rows, m, pb);
    const char *from = r->p;
    if (!ls_jr_skip(r)) return false;
    if (c != '{') {
        ls_fj_note(pb, LS_INVALID_REQUEST, "send nested arrays or {\"dtype\", \"shape\", \"data\"}",
                   "%s must be nested arrays of numbers or a base64 tensor object", what);
        return true;
    }
    if (pb->st != LS_OK) return true;
    ls_jr sub;
    ls_jr_init(&sub, from, (size_t)(r->p - from));
    sub.depth = r->depth;
    json_t *j = ls_fj_object(&sub);
    if (!j && sub.failed) return ls_jr_fail(r, sub.message);
    if (!j) {
        ls_fj_note(pb, LS_INTERNAL, NULL, "%s: out of memory", what);
        return true;
    }
    ls_error err;
    ls_error_init(&err);
    ls_tensor t;
    ls_status st = ls_json_tensor_parse(j, what, &t, &err);
    json_decref(j);
    if (st == LS_OK) {
        if (max_rows > 0 && t.ndim >= 1 && t.shape[0] > max_rows)
            st = ls_error_set(&err, LS_PAYLOAD_TOO_LARGE,
                              "send fewer tokens per request or restart with a larger --max-request-tokens",
                              "%s has %lld rows, more than the %d one request may carry", what, (long long)t.shape[0],
                              max_rows);
        else
            st = ls_forward_take_matrix(&t, what, rows, cols, &m->v, &m->rows, &err);
        ls_tensor_free(&t);
    }
    if (st != LS_OK) ls_fj_note(pb, st, err.hint[0] ? err.hint : NULL, "%s", err.message);
    ls_error_free(&err);
    return true;
}

/* "adapter": a name or null (single); "adapters": a name or null per
 * token (list; given unless absent or null), each distinct name kept
 * once with an index per token. */
typedef struct {
    bool given;
    char *single;        /* owned */
    ls_token_names list; /* owned, copies: the first `keep` entries */
    int count;           /* the list's entries, kept or not */
    int keep;            /* entries kept at most (> 0); past it only counted */
} ls_fj_names;

static void ls_fj_names_free(ls_fj_names *nm) {
    free(nm->single);
    ls_token_names_free(&nm->list);
}

/* One name or null: into buf (len bytes; "" for null, *is_null set).
 * A problem with the name is noted. */
static bool ls_fj_name(ls_jr *r, const char *what, char *buf, size_t len, bool *is_null, ls_fj_problem *pb) {
    buf[0] = '\0';
    *is_null = true;
    char c = ls_jr_peek(r);
    if (c == 'n') {
        char w;
        return ls_jr_literal(r, &w);
    }
    if (c != '"') {
        /* "adapter" is one name for the whole request; a list of one per
         * token is "adapters". */
        const bool one_for_all = c == '[' && !strcmp(what, "adapter");
        ls_fj_note(pb, LS_INVALID_REQUEST,
                   one_for_all ? "for a name per token send \"adapters\": [...] (T names or nulls)" : NULL,
                   "%s must be a string or null", what);
        return ls_jr_skip(r);
    }
    size_t got;
    if (!ls_jr_string(r, buf, len, &got)) return false;
    if (got >= len || strlen(buf) != got) buf[0] = '\0'; /* too long, or cut: not a valid name */
    ls_error err;
    ls_error_init(&err);
    if (ls_adapter_name_check(buf, what, &err) != LS_OK) ls_fj_note(pb, err.code, err.hint, "%s", err.message);
    else *is_null = false;
    ls_error_free(&err);
    return true;
}

/* How a JSON body names one adapter for every token. */
#define ONE_IN_JSON "send \"adapter\": NAME"

/* one_hint: how the request names one adapter for every token, for a
 * list given as a single name. */
static bool ls_fj_names_read(ls_jr *r, bool list, const char *one_hint, ls_fj_names *nm, ls_fj_problem *pb) {
    char buf[256];
    bool is_null;
    if (!list) {
        if (!ls_fj_name(r, "adapter", buf, sizeof buf, &is_null, pb)) return false;
        if (!is_null && !(nm->single = strdup(buf))) ls_fj_note(pb, LS_INTERNAL, NULL, "out of memory");
        return true;
    }
    if (ls_jr_peek(r) == 'n') {
        char w;
        return ls_jr_literal(r, &w); /* "adapters": null is no list */
    }
    nm->given = true;
    if (ls_jr_peek(r) != '[') {
        char hint[160];
        snprintf(hint, sizeof hint, "for one adapter for every token %s; \"adapters\" is a list, [NAME or null per token]",
                 one_hint);
        ls_fj_note(pb, LS_INVALID_REQUEST, ls_jr_peek(r) == '"' ? hint : NULL,
                   "\"adapters\" must be an array (a name or null per token)");
        return ls_jr_skip(r);
    }
    r->p++;
    if (ls_jr_peek(r) == ']') return ls_jr_punct(r, ']');
    r->depth++;
    do {
        char what[32];
        snprintf(what, sizeof what, "adapters[%d]", nm->count);
        if (!ls_fj_name(r, what, buf, sizeof buf, &is_null, pb)) return false;
        /* After a problem, or past `keep`, the rest of the list is still
         * read, for its syntax, and counted, but no longer kept: a list
         * far longer than any request costs no memory. */
        if (nm->count < INT_MAX) nm->count++;
        if (pb->st != LS_OK || nm->list.T >= nm->keep) continue;
        const int k = is_null ? -1 : ls_token_names_index(&nm->list, buf);
        if (!is_null && k < 0) ls_fj_note(pb, LS_INTERNAL, NULL, "out of memory");
        if (!ls_token_names_push(&nm->list, k)) ls_fj_note(pb, LS_INTERNAL, NULL, "out of memory");
    } while (ls_jr_peek(r) == ',' && ls_jr_punct(r, ','));
    r->depth--;
    return ls_jr_punct(r, ']');
}

/* A given list's entries against the T tokens: 422 when they differ
 * (hint says how to fix it), else the list moves into *names. */
static ls_status ls_fj_names_take(ls_fj_names *nm, int T, const char *hint, ls_token_names *names, ls_error *err) {
    if (nm->count != T)
        return ls_error_set(err, LS_INVALID_SHAPE, hint, "\"adapters\" has %d entries for %d tokens", nm->count, T);
    *names = nm->list;
    memset(&nm->list, 0, sizeof nm->list);
    return LS_OK;
}

/* The per-field problems, reported in the order of the fields. */
enum { LS_FJ_KEYS, LS_FJ_LAYER, LS_FJ_ENCODING, LS_FJ_X, LS_FJ_GAMMAS, LS_FJ_NAMES, LS_FJ_FIELDS };

static const char *const ls_fj_known[] = {"layer", "x", "gammas", "adapter", "adapters", "encoding", NULL};

/* One parse: the reader, what each field gave and its problems. */
typedef struct {
    ls_jr r;
    const ls_dims *dims;
    int max_tokens;
    ls_forward_req *req;
    ls_fj_problem pb[LS_FJ_FIELDS];
    ls_fj_matrix x, g;
    ls_fj_names one, per_token;
    bool seen[7], have_x, have_g, layer_given;
} ls_fj_parse;

static bool ls_fj_layer(ls_fj_parse *ps) {
    ls_jr *r = &ps->r;
    char c = ls_jr_peek(r);
    double d;
    bool is_int = false, ok = true;
    long long v = 0;
    if (c == 'n') {
        char w;
        ok = ls_jr_literal(r, &w);
    } else if (c == '-' || (c >= '0' && c <= '9')) {
        ok = ls_jr_number(r, &d, &is_int, &v);
        if (ok && !is_int) ls_fj_note(&ps->pb[LS_FJ_LAYER], LS_INVALID_REQUEST, NULL, "\"layer\" must be an integer");
    } else {
        ls_fj_note(&ps->pb[LS_FJ_LAYER], LS_INVALID_REQUEST, NULL, "\"layer\" must be an integer");
        ok = ls_jr_skip(r);
    }
    if (ok && is_int) {
        ls_error e;
        ls_error_init(&e);
        ps->layer_given = true;
        if (ls_forward_check_layer(v, ps->dims, &ps->req->layer_index, &e) != LS_OK)
            ls_fj_note(&ps->pb[LS_FJ_LAYER], e.code, e.hint, "%s", e.message);
        else ps->req->layer = (int)v;
        ls_error_free(&e);
    }
    return ok;
}

static bool ls_fj_encoding(ls_fj_parse *ps) {
    ls_jr *r = &ps->r;
    char c = ls_jr_peek(r), buf[16];
    size_t blen = 0;
    bool ok = true;
    if (c == 'n') {
        char w;
        ok = ls_jr_literal(r, &w);
    } else if (c == '"' && (ok = ls_jr_string(r, buf, sizeof buf, &blen)) && blen == 6 && !strcmp(buf, "base64")) {
        ps->req->base64 = true;
    } else if (ok && !(c == '"' && blen == 4 && !strcmp(buf, "json"))) {
        if (c != '"') ok = ls_jr_skip(r);
        ls_fj_note(&ps->pb[LS_FJ_ENCODING], LS_INVALID_REQUEST, NULL, "\"encoding\" is \"json\" or \"base64\"");
    }
    return ok;
}

/* The value of member k (an index into ls_fj_known, or its end for an
 * unknown key); false when the JSON itself failed. */
static bool ls_fj_member(ls_fj_parse *ps, int k, const char *key) {
    ls_jr *r = &ps->r;
    if (!ls_fj_known[k]) {
        char hint[256], near[96];
        ls_text_unknown_key(key, ls_fj_known, hint, sizeof hint, near, sizeof near);
        ls_fj_note(&ps->pb[LS_FJ_KEYS], LS_INVALID_REQUEST, hint, "unknown key \"%.64s\" in the forward request%s", key,
                   near);
        return ls_jr_skip(r);
    }
    if (!strcmp(key, "layer")) return ls_fj_layer(ps);
    if (!strcmp(key, "encoding")) return ls_fj_encoding(ps);
    if (!strcmp(key, "x")) {
        ps->have_x = true;
        return ls_fj_tensor(r, "x", -1, ps->dims->H, ps->max_tokens, &ps->x, &ps->pb[LS_FJ_X]);
    }
    if (!strcmp(key, "gammas")) {
        if (ls_jr_peek(r) == 'n') {
            char w;
            return ls_jr_literal(r, &w);
        }
        ps->have_g = true;
        return ls_fj_tensor(r, "gammas", -1, ps->dims->n, 0, &ps->g, &ps->pb[LS_FJ_GAMMAS]);
    }
    if (!strcmp(key, "adapters"))
        return ls_fj_names_read(r, true, ONE_IN_JSON, &ps->per_token, &ps->pb[LS_FJ_NAMES]);
    return ls_fj_names_read(r, false, ONE_IN_JSON, &ps->one, &ps->pb[LS_FJ_NAMES]);
}

/* The body: one object of known keys, each at most once, then its end. */
static void ls_fj_body(ls_fj_parse *ps) {
    ls_jr *r = &ps->r;
    if (ls_jr_peek(r) != '{') {
        if (ls_jr_skip(r) && ls_jr_at_end(r))
            ls_fj_note(&ps->pb[LS_FJ_KEYS], LS_INVALID_REQUEST, NULL, "the body must be a JSON object");
        else if (!r->failed)
            ls_jr_fail(r, "end of input expected");
        return;
    }
    r->p++;
    r->depth = 1; /* values are skipped inside the body's object, as jansson counts depth */
    bool more = ls_jr_peek(r) != '}';
    while (more && !r->failed) {
        char key[80];
        size_t klen;
        if (!ls_jr_string(r, key, sizeof key, &klen) || !ls_jr_punct(r, ':')) break;
        int k = 0;
        while (ls_fj_known[k] && (klen != strlen(ls_fj_known[k]) || strcmp(key, ls_fj_known[k]))) k++;
        if (ls_fj_known[k] && ps->seen[k]) {
            ls_jr_fail(r, "duplicate object key");
            break;
        }
        if (ls_fj_known[k]) ps->seen[k] = true;
        if (!ls_fj_member(ps, k, key)) break;
        if (ls_jr_peek(r) != ',') break;
        r->p++;
    }
    if (!r->failed) ls_jr_punct(r, '}');
    if (!r->failed && !ls_jr_at_end(r)) ls_jr_fail(r, "end of input expected");
}

/* What the fields say together, then the first field's problem. */
static ls_status ls_fj_check(ls_fj_parse *ps, ls_error *err) {
    ls_fj_problem *pb = ps->pb;
    if (!ps->have_x && pb[LS_FJ_X].st == LS_OK)
        ls_fj_note(&pb[LS_FJ_X], LS_INVALID_REQUEST, "send \"x\": [T][H]", "the request has no \"x\"");
    if (!ps->layer_given && pb[LS_FJ_LAYER].st == LS_OK) { /* the default, the checkpoint's layer 0 */
        ls_error e;
        ls_error_init(&e);
        if (ls_forward_check_layer(0, ps->dims, &ps->req->layer_index, &e) != LS_OK)
            ls_fj_note(&pb[LS_FJ_LAYER], e.code, e.hint, "%s (no \"layer\" given: 0 is the default)", e.message);
        ls_error_free(&e);
    }
    if (ps->have_g && pb[LS_FJ_GAMMAS].st == LS_OK && ps->g.rows != ps->x.rows && pb[LS_FJ_X].st == LS_OK)
        ls_fj_note(&pb[LS_FJ_GAMMAS], LS_INVALID_SHAPE, NULL, "gammas has %d rows, expected %d (one per token)",
                   ps->g.rows, ps->x.rows);
    if (ps->one.single && ps->per_token.given)
        ls_fj_note(&pb[LS_FJ_NAMES], LS_INVALID_REQUEST, "send \"adapter\" for all tokens or \"adapters\" per token",
                   "give either \"adapter\" or \"adapters\", not both");
    for (int f = 0; f < LS_FJ_FIELDS; f++)
        if (pb[f].st != LS_OK) return ls_fj_raise(&pb[f], err);
    return LS_OK;
}

/* Moves what was parsed into the request. */
static ls_status ls_fj_take(ls_fj_parse *ps, ls_error *err) {
    ls_forward_req *req = ps->req;
    ls_status st = LS_OK;
    req->T = ps->x.rows;
    req->x = ps->x.v, ps->x.v = NULL;
    if (ps->have_g) req->gammas = ps->g.v, ps->g.v = NULL;
    if (ps->per_token.given) {
        st = ls_fj_names_take(&ps->per_token, req->T, "send one adapter name or null per row of x", &req->names, err);
    } else if (ps->one.single) {
        if (!ls_token_names_fill(&req->names, ps->one.single, req->T))
            st = ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
    }
    return st;
}

ls_status ls_forward_req_parse_json(const char *body, size_t len, const ls_dims *dims, int max_tokens,
                                    ls_forward_req *req, ls_error *err) {
    memset(req, 0, sizeof *req);
    ls_fj_parse ps;
    memset(&ps, 0, sizeof ps);
    ls_jr_init(&ps.r, body, len);
    ps.dims = dims;
    ps.max_tokens = max_tokens;
    ps.one.keep = ps.per_token.keep = max_tokens > 0 ? max_tokens : INT_MAX;
    ps.req = req;
    ls_fj_body(&ps);
    ls_status st;
    if (ps.r.failed)
        st = ls_error_set(err, LS_INVALID_JSON, NULL, "the body is not valid JSON: %s (at byte %zu)", ps.r.message,
                          ps.r.at);
    else
        st = ls_fj_check(&ps, err);
    if (st == LS_OK) st = ls_fj_take(&ps, err);
    free(ps.x.v);
    free(ps.g.v);
    ls_fj_names_free(&ps.one);
    ls_fj_names_free(&ps.per_token);
    if (st != LS_OK) ls_forward_req_free(req);
    return st;
}

/* See forward_internal.h. */
ls_status ls_forward_names_text(const char *text, ls_forward_req *req, ls_error *err) {
    ls_jr r;
    ls_jr_init(&r, text, strlen(text));
    ls_fj_names nm;
    memset(&nm, 0, sizeof nm);
    nm.keep = req->T;
    ls_fj_problem pb;
    memset(&pb, 0, sizeof pb);
    if (ls_fj_names_read(&r, true, "give ?adapter=NAME (or the X-Lorasink-Adapter header)", &nm, &pb) &&
        !ls_jr_at_end(&r))
        ls_jr_fail(&r, "end of input expected");
    ls_status st = LS_OK;
    if (r.failed)
        st = ls_error_set(err, LS_INVALID_REQUEST, "write it as JSON text: [\"a1\", null, ...]",
                          "the body's metadata \"adapters\" is not JSON: %s (at byte %zu)", r.message, r.at);
    else if (pb.st != LS_OK)
        st = ls_fj_raise(&pb, err);
    else if (nm.given)
        st = ls_fj_names_take(&nm, req->T, "name one adapter (or null) per row of x", &req->names, err);
    ls_fj_names_free(&nm);
    return st;
}
