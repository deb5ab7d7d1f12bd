/* Crash consistency of --state-dir: a client uploads, replaces and
 * deletes adapters as fast as the server answers while the server is
 * killed with SIGKILL at random moments and restarted, 52 times. After
 * every restart each change acknowledged before the kill is there with
 * its version and sha256, the one change in flight at the kill is
 * either wholly there or wholly absent, no file was set aside as
 * corrupt, versions go on from where they were, and forwards with the
 * restored adapters give bit for bit what the same adapters gave before
 * any crash. */
#include <dirent.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/util/tiny_server.h"

#define NNAMES 4
#define NALPHA 4 /* lora_alpha 1..4: four adapters with distinct factors */
#define KILLS 52

/* What the client was told about one name. */
typedef struct {
    bool registered;
    long version; /* of the registered adapter, or the last one (versions go on after a delete) */
    int alpha;
    char sha[65];
} name_state;

typedef enum { OP_LOAD, OP_REPLACE, OP_DELETE } op_kind;

typedef struct {
    int name, alpha;
    op_kind kind;
} op;

typedef struct {
    const ls_test_server *srv;
    const uint8_t *body; /* the example adapter as safetensors */
    size_t len;
    name_state st[NNAMES];
    const char (*sha_of)[65]; /* sha256 per alpha (index alpha - 1) */
    uint64_t rng;
    bool in_doubt; /* the op below was sent and not answered */
    op pending;
    atomic_long acked;   /* read by the test while the client runs */
    atomic_bool stopped; /* the client has returned */
    char fail[512];
} client;

static uint64_t next_rand(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

static void name_of(int k, char *buf, size_t len) { snprintf(buf, len, "n%d", k); }

/* Runs op against the server. 1: acknowledged (state updated), 0: no
 * answer (the server is gone), -1: a wrong answer (c->fail says why). */
static int client_run(client *c, op o) {
    char name[16], path[128];
    name_of(o.name, name, sizeof name);
    name_state *s = &c->st[o.name];
    ls_test_response r;
    int rc;
    if (o.kind == OP_DELETE) {
        snprintf(path, sizeof path, "/adapters/%s", name);
        rc = ls_test_http(c->srv, "DELETE", path, NULL, NULL, 0, NULL, &r);
    } else {
        snprintf(path, sizeof path, "/adapters?name=%s&lora_alpha=%d%s", name, o.alpha,
                 o.kind == OP_REPLACE ? "&replace=true" : "");
        rc = ls_test_http(c->srv, "POST", path, "application/octet-stream", c->body, c->len, NULL, &r);
    }
    if (rc != 0 || r.status == 0) {
        ls_test_response_free(&r);
        return 0;
    }
    int ok = 1;
    if (o.kind == OP_DELETE) {
        if (r.status != 200 && r.status != 204) {
            snprintf(c->fail, sizeof c->fail, "DELETE %s -> %ld: %s", name, r.status, r.body);
            ok = -1;
        } else {
            s->registered = false;
        }
    } else {
        json_t *j = ls_test_response_json(&r);
        long v = j ? (long)json_integer_value(json_object_get(j, "version")) : 0;
        const char *sha = j ? json_string_value(json_object_get(j, "sha256")) : NULL;
        if (r.status != 201 || !sha) {
            snprintf(c->fail, sizeof c->fail, "POST %s -> %ld: %s", path, r.status, r.body);
            ok = -1;
        } else if (v != s->version + 1 || strcmp(sha, c->sha_of[o.alpha - 1])) {
            snprintf(c->fail, sizeof c->fail, "POST %s gave version %ld sha %.12s, wanted %ld sha %.12s", path, v, sha,
                     s->version + 1, c->sha_of[o.alpha - 1]);
            ok = -1;
        } else {
            s->registered = true;
            s->version = v;
            s->alpha = o.alpha;
            snprintf(s->sha, sizeof s->sha, "%s", sha);
        }
        json_decref(j);
    }
    ls_test_response_free(&r);
    return ok;
}

/* Random changes until the server stops answering. */
static void *client_loop(void *arg) {
    client *c = arg;
    for (;;) {
        op o = {.name = (int)(next_rand(&c->rng) % NNAMES), .alpha = 1 + (int)(next_rand(&c->rng) % NALPHA)};
        int dice = (int)(next_rand(&c->rng) % 4);
        o.kind = !c->st[o.name].registered ? OP_LOAD : dice == 0 ? OP_DELETE : OP_REPLACE;
        int rc = client_run(c, o);
        if (rc == 1) {
            atomic_fetch_add(&c->acked, 1);
            continue;
        }
        if (rc == 0) {
            c->in_doubt = true;
            c->pending = o;
        }
        atomic_store(&c->stopped, true);
        return NULL;
    }
}

/* The y of a forward of the example's x with adapter name (text). */
static char *forward_y(tiny_server *ts, const char *name) {
    json_t *req = json_pack("{s:O, s:O, s:[s, n, s]}", "x", json_object_get(ts->tiny, "x"), "gammas",
                            json_object_get(ts->tiny, "gammas"), "adapters", name, name);
    json_t *resp = tiny_post_json(ts, "/forward", req, 200);
    char *y = json_dumps(json_object_get(resp, "y"), JSON_COMPACT);
    json_decref(resp);
    json_decref(req);
    return y;
}

/* The server's registry as name_state (by GET /adapters). */
static void observe(tiny_server *ts, name_state *seen) {
    memset(seen, 0, sizeof(name_state) * NNAMES);
    ls_test_response r;
    assert_int_equal(ls_test_http(ts->srv, "GET", "/adapters", NULL, NULL, 0, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    json_t *j = ls_test_response_json(&r);
    json_t *list = json_object_get(j, "adapters");
    for (size_t i = 0; i < json_array_size(list); i++) {
        json_t *a = json_array_get(list, i);
        int k = -1;
        const char *name = json_string_value(json_object_get(a, "name"));
        assert_non_null(name);
        assert_int_equal(sscanf(name, "n%d", &k), 1);
        assert_true(k >= 0 && k < NNAMES);
        seen[k].registered = true;
        seen[k].version = (long)json_integer_value(json_object_get(a, "version"));
        snprintf(seen[k].sha, sizeof seen[k].sha, "%s", json_string_value(json_object_get(a, "sha256")));
    }
    json_decref(j);
    ls_test_response_free(&r);
}

static bool same(const name_state *a, const name_state *b) {
    if (a->registered != b->registered) return false;
    return !a->registered || (a->version == b->version && !strcmp(a->sha, b->sha));
}

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.' || !strncmp(e->d_name, ".tmp", 4);
    closedir(d);
    return n;
}

static void test_sigkill_loses_nothing_acknowledged(void **state) {
    (void)state;
    char *state_dir = ls_test_mkdtemp();
    const char *extra[] = {"--state-dir", state_dir, "--log-level", "warn", NULL};
    tiny_server ts;
    assert_true(tiny_server_start(&ts, "interleaved", extra));
    size_t len;
    uint8_t *body = tiny_adapter_safetensors(&ts, NULL, &len);

    /* Before any crash: each alpha's sha256 and forward output. */
    char sha_of[NALPHA][65], *y_of[NALPHA];
    for (int a = 1; a <= NALPHA; a++) {
        char path[128];
        snprintf(path, sizeof path, "/adapters?name=ref&lora_alpha=%d", a);
        ls_test_response r;
        assert_int_equal(ls_test_http(ts.srv, "POST", path, "application/octet-stream", body, len, NULL, &r), 0);
        assert_int_equal(r.status, 201);
        json_t *j = ls_test_response_json(&r);
        snprintf(sha_of[a - 1], 65, "%s", json_string_value(json_object_get(j, "sha256")));
        json_decref(j);
        ls_test_response_free(&r);
        y_of[a - 1] = forward_y(&ts, "ref");
        /* alpha 4 is the conformance example itself */
        if (a == 4) tiny_check_forward(&ts, "ref", "interleaved");
        assert_int_equal(ls_test_http(ts.srv, "DELETE", "/adapters/ref", NULL, NULL, 0, NULL, &r), 0);
        ls_test_response_free(&r);
    }

    client c = {.body = body, .len = len, .sha_of = (const char (*)[65])sha_of, .rng = 0x9E3779B97F4A7C15ull};
    uint64_t rng = 12345;
    long acked = 0, in_doubt = 0, doubt_done = 0;
    for (int kill_no = 0; kill_no < KILLS; kill_no++) {
        c.srv = ts.srv;
        c.in_doubt = false;
        atomic_store(&c.stopped, false);
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, client_loop, &c), 0);
        /* The kill comes at a random moment after the first change of the
         * round is acknowledged. Timed from the restart alone, it often
         * came before the first answer on a busy machine, and the rounds
         * changed next to nothing (49 changes in 52 kills). */
        for (int t = 0; t < 30000 && atomic_load(&c.acked) == 0 && !atomic_load(&c.stopped); t++) usleep(1000);
        const bool progressed = atomic_load(&c.acked) > 0;
        usleep((useconds_t)(2000 + next_rand(&rng) % 120000));
        kill(ls_test_server_pid(ts.srv), SIGKILL);
        pthread_join(th, NULL);
        if (c.fail[0]) fail_msg("before kill %d: %s", kill_no, c.fail);
        if (!progressed) fail_msg("before kill %d: no change acknowledged in 30 s", kill_no);
        acked += atomic_load(&c.acked);
        atomic_store(&c.acked, 0);
        assert_true(tiny_server_restart(&ts, true));

        name_state seen[NNAMES];
        observe(&ts, seen);
        for (int k = 0; k < NNAMES; k++) {
            name_state *want = &c.st[k];
            if (c.in_doubt && c.pending.name == k) {
                /* Wholly done, or not at all. */
                name_state done = *want;
                if (c.pending.kind == OP_DELETE) {
                    done.registered = false;
                } else {
                    done.registered = true;
                    done.version = want->version + 1;
                    done.alpha = c.pending.alpha;
                    snprintf(done.sha, sizeof done.sha, "%s", sha_of[c.pending.alpha - 1]);
                }
                if (same(&seen[k], &done)) {
                    *want = done;
                    doubt_done++;
                } else if (!same(&seen[k], want)) {
                    fail_msg("kill %d: n%d in flight (%d) is half there: registered %d version %ld", kill_no, k,
                             (int)c.pending.kind, seen[k].registered, seen[k].version);
                }
                in_doubt++;
                continue;
            }
            if (!same(&seen[k], want))
                fail_msg("kill %d: n%d is registered=%d v%ld %.12s; acknowledged registered=%d v%ld %.12s", kill_no,
                         k, seen[k].registered, seen[k].version, seen[k].sha, want->registered, want->version,
                         want->sha);
        }
        /* A kill never leaves a file that cannot be read. */
        char corrupt[1024];
        snprintf(corrupt, sizeof corrupt, "%s/corrupt", state_dir);
        assert_int_equal(count_entries(corrupt), 0);
        /* Forwards with the restored adapters, bit for bit. */
        if (kill_no % 4 == 0) {
            for (int k = 0; k < NNAMES; k++) {
                if (!c.st[k].registered) continue;
                char name[16];
                name_of(k, name, sizeof name);
                char *y = forward_y(&ts, name);
                assert_string_equal(y, y_of[c.st[k].alpha - 1]);
                free(y);
            }
        }
    }
    print_message("%d kills: %ld changes acknowledged, %ld in flight at a kill (%ld of them done)\n", KILLS, acked,
                  in_doubt, doubt_done);
    /* Nothing left behind but two files per name: its record or
     * tombstone, and its floor. */
    assert_true(count_entries(state_dir) <= 2 * (NNAMES + 1 /* ref */));
    tiny_server_stop(&ts);
    for (int a = 0; a < NALPHA; a++) free(y_of[a]);
    free(body);
    ls_test_rmtree(state_dir);
    free(state_dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sigkill_loses_nothing_acknowledged),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
