/* gpu/graph_cache.h: a shape is captured on its second sighting and
 * replayed after; the least recently used entry goes when full, its graph
 * destroyed exactly once; a failed capture is not tried again; a cache
 * of 0 never captures. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "gpu/graph_cache.h"

static int g_destroyed[16];

static void destroy(void *graph) { g_destroyed[(intptr_t)graph]++; }

static ls_graph_key key(int layer, int T) {
    ls_graph_key k;
    memset(&k, 0, sizeof k);
    k.layer = layer;
    k.T = T;
    k.path = 2;
    k.ntasks = 1;
    return k;
}

/* Looks k up; on the sighting that asks for it, "captures" graph g. */
static void *use(ls_graph_cache *c, int layer, int T, intptr_t g) {
    const ls_graph_key k = key(layer, T);
    bool capture = false;
    void *got = ls_graph_cache_get(c, &k, &capture);
    if (capture) ls_graph_cache_put(c, &k, (void *)g);
    return got;
}

static void test_second_sighting_captures(void **state) {
    (void)state;
    memset(g_destroyed, 0, sizeof g_destroyed);
    ls_graph_cache c;
    assert_true(ls_graph_cache_init(&c, 4, destroy));
    const ls_graph_key k = key(0, 8);
    bool capture = true;
    assert_null(ls_graph_cache_get(&c, &k, &capture));
    assert_false(capture); /* first sighting: direct launches */
    assert_null(ls_graph_cache_get(&c, &k, &capture));
    assert_true(capture);
    ls_graph_cache_put(&c, &k, (void *)(intptr_t)1);
    assert_ptr_equal(ls_graph_cache_get(&c, &k, &capture), (void *)(intptr_t)1);
    assert_false(capture);
    /* Another layer is another shape. */
    const ls_graph_key k1 = key(1, 8);
    assert_null(ls_graph_cache_get(&c, &k1, &capture));
    assert_false(capture);
    assert_int_equal(c.hits, 1);
    assert_int_equal(c.captures, 1);
    ls_graph_cache_free(&c);
    assert_int_equal(g_destroyed[1], 1);
}

static void test_lru_eviction(void **state) {
    (void)state;
    memset(g_destroyed, 0, sizeof g_destroyed);
    ls_graph_cache c;
    assert_true(ls_graph_cache_init(&c, 2, destroy));
    for (int i = 0; i < 2; i++) use(&c, 0, 1, 1), use(&c, 0, 2, 2); /* both captured */
    assert_ptr_equal(use(&c, 0, 1, 9), (void *)(intptr_t)1);      /* T=1 is now the more recent */
    assert_null(use(&c, 0, 3, 3));                               /* a third shape evicts T=2 */
    assert_int_equal(g_destroyed[2], 1);
    assert_int_equal(g_destroyed[1], 0);
    assert_ptr_equal(use(&c, 0, 1, 9), (void *)(intptr_t)1);
    ls_graph_cache_clear(&c); /* buffers about to change: every graph goes */
    assert_int_equal(g_destroyed[1], 1);
    bool capture = true;
    const ls_graph_key k = key(0, 1);
    assert_null(ls_graph_cache_get(&c, &k, &capture));
    assert_false(capture); /* forgotten, sightings too */
    ls_graph_cache_free(&c);
    for (int i = 0; i < 16; i++) assert_true(g_destroyed[i] <= 1);
}

/* A shape whose capture failed launches directly from then on. */
static void test_failed_capture_not_retried(void **state) {
    (void)state;
    ls_graph_cache c;
    assert_true(ls_graph_cache_init(&c, 4, destroy));
    const ls_graph_key k = key(0, 5);
    bool capture = false;
    ls_graph_cache_get(&c, &k, &capture);
    assert_null(ls_graph_cache_get(&c, &k, &capture));
    assert_true(capture);
    ls_graph_cache_put(&c, &k, NULL);
    for (int i = 0; i < 3; i++) {
        assert_null(ls_graph_cache_get(&c, &k, &capture));
        assert_false(capture);
    }
    assert_int_equal(c.captures, 0);
    ls_graph_cache_free(&c);
}

static void test_off(void **state) {
    (void)state;
    ls_graph_cache c;
    assert_true(ls_graph_cache_init(&c, 0, destroy));
    const ls_graph_key k = key(0, 1);
    bool capture = true;
    for (int i = 0; i < 3; i++) {
        assert_null(ls_graph_cache_get(&c, &k, &capture));
        assert_false(capture);
    }
    ls_graph_cache_free(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_second_sighting_captures),
        cmocka_unit_test(test_lru_eviction),
        cmocka_unit_test(test_failed_capture_not_retried),
        cmocka_unit_test(test_off),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
