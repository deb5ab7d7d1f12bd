/* gpu/graph_cache.h: a shape is captured on its second sighting and
 * replayed after; the least recently used graph goes when full, its graph
 * destroyed exactly once, and a shape seen once never pushes a graph
 * out; a failed capture (or a dropped graph) is not tried again and
 * pushes no graph out; a cache
 * whose evicted graphs were mostly never replayed stops capturing; a
 * cache of 0 never captures. */
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
    assert_null(use(&c, 0, 3, 3));                               /* a third shape, seen once: nothing goes */
    assert_int_equal(g_destroyed[2], 0);
    assert_ptr_equal(use(&c, 0, 2, 9), (void *)(intptr_t)2);
    assert_null(use(&c, 0, 3, 3)); /* seen again: captured, and T=1, now the older, goes */
    assert_int_equal(g_destroyed[1], 1);
    assert_int_equal(g_destroyed[2], 0);
    assert_ptr_equal(use(&c, 0, 3, 9), (void *)(intptr_t)3);
    assert_int_equal(c.evicted, 1);
    assert_int_equal(c.wasted, 0); /* T=1 had been replayed */
    ls_graph_cache_clear(&c); /* buffers about to change: every graph goes */
    assert_int_equal(g_destroyed[2], 1);
    assert_int_equal(g_destroyed[3], 1);
    bool capture = true;
    const ls_graph_key k = key(0, 1);
    assert_null(ls_graph_cache_get(&c, &k, &capture));
    assert_false(capture); /* forgotten, sightings too */
    ls_graph_cache_free(&c);
    for (int i = 0; i < 16; i++) assert_true(g_destroyed[i] <= 1);
}

/* Many one-off shapes between two replays of a hot one keep its graph. */
static void test_sightings_keep_graphs(void **state) {
    (void)state;
    memset(g_destroyed, 0, sizeof g_destroyed);
    ls_graph_cache c;
    assert_true(ls_graph_cache_init(&c, 2, destroy));
    use(&c, 0, 1, 1), use(&c, 0, 1, 1);
    for (int T = 100; T < 140; T++) assert_null(use(&c, 0, T, 5));
    assert_ptr_equal(use(&c, 0, 1, 9), (void *)(intptr_t)1);
    assert_int_equal(g_destroyed[1], 0);
    assert_int_equal(c.captures, 1);
    ls_graph_cache_free(&c);
}

/* Shapes that come back only after they were evicted cost a capture each
 * and are never replayed: the cache stops capturing, keeps what it has. */
static void test_waste_stops_capture(void **state) {
    (void)state;
    memset(g_destroyed, 0, sizeof g_destroyed);
    ls_graph_cache c;
    assert_true(ls_graph_cache_init(&c, 2, destroy));
    int stops = 0;
    for (int round = 0; round < 2 * LS_GRAPH_WASTE_MIN + 4; round++) {
        const ls_graph_key k = key(round, 8);
        bool capture = false;
        ls_graph_cache_get(&c, &k, &capture);
        assert_false(capture);
        ls_graph_cache_get(&c, &k, &capture);
        if (!capture) break; /* stopped */
        stops += ls_graph_cache_put(&c, &k, (void *)(intptr_t)(round % 2 + 1));
    }
    assert_int_equal(stops, 1);
    assert_true(c.stopped);
    assert_int_equal(c.wasted, LS_GRAPH_WASTE_MIN);
    assert_int_equal(c.captures, LS_GRAPH_WASTE_MIN + 2);
    /* The graphs it holds still replay. */
    const ls_graph_key last = key(LS_GRAPH_WASTE_MIN + 1, 8);
    bool capture = true;
    assert_non_null(ls_graph_cache_get(&c, &last, &capture));
    ls_graph_cache_clear(&c); /* starts again */
    assert_false(c.stopped);
    ls_graph_cache_free(&c);
}

/* A graph whose launch failed is destroyed and not captured again. */
static void test_drop(void **state) {
    (void)state;
    memset(g_destroyed, 0, sizeof g_destroyed);
    ls_graph_cache c;
    assert_true(ls_graph_cache_init(&c, 4, destroy));
    use(&c, 0, 7, 4), use(&c, 0, 7, 4);
    const ls_graph_key k = key(0, 7);
    ls_graph_cache_drop(&c, &k);
    assert_int_equal(g_destroyed[4], 1);
    bool capture = true;
    for (int i = 0; i < 3; i++) {
        assert_null(ls_graph_cache_get(&c, &k, &capture));
        assert_false(capture);
    }
    assert_int_equal(c.failures, 1);
    ls_graph_cache_free(&c);
    assert_int_equal(g_destroyed[4], 1);
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

/* A failed capture in a full cache pushes no graph out (it replaced the
 * least recently used one, replayed or not), and it is remembered beside
 * the sightings: other captures later do not make it try again. */
static void test_failure_evicts_nothing(void **state) {
    (void)state;
    memset(g_destroyed, 0, sizeof g_destroyed);
    ls_graph_cache c;
    assert_true(ls_graph_cache_init(&c, 2, destroy));
    for (int i = 0; i < 3; i++) use(&c, 0, 1, 1), use(&c, 0, 2, 2); /* both captured and replayed */
    const ls_graph_key k = key(0, 9);
    bool capture = false;
    ls_graph_cache_get(&c, &k, &capture);
    ls_graph_cache_get(&c, &k, &capture);
    assert_true(capture);
    ls_graph_cache_put(&c, &k, NULL);
    assert_int_equal(g_destroyed[1] + g_destroyed[2], 0);
    assert_int_equal(c.evicted, 0);
    assert_ptr_equal(use(&c, 0, 1, 9), (void *)(intptr_t)1);
    assert_ptr_equal(use(&c, 0, 2, 9), (void *)(intptr_t)2);
    /* A new shape captured (evicting one graph) leaves the failure known. */
    use(&c, 0, 3, 3), use(&c, 0, 3, 3);
    for (int i = 0; i < 3; i++) {
        assert_null(ls_graph_cache_get(&c, &k, &capture));
        assert_false(capture);
    }
    assert_int_equal(c.failures, 1);
    ls_graph_cache_free(&c);
    for (int i = 0; i < 16; i++) assert_true(g_destroyed[i] <= 1);
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
        cmocka_unit_test(test_sightings_keep_graphs),
        cmocka_unit_test(test_waste_stops_capture),
        cmocka_unit_test(test_drop),
        cmocka_unit_test(test_failed_capture_not_retried),
        cmocka_unit_test(test_failure_evicts_nothing),
        cmocka_unit_test(test_off),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
