/* The pool operations the fault sweeps run, each from a world set up the
 * same way every time, shared by the allocation sweeps
 * (test_fault_pool.c) and the device sweeps (test_fault_device.c):
 * ls_pool_load (a new name, pinned or not, a replace, a load that evicts),
 * ls_pool_delete, ls_pool_forward over a mix of adapters (one of them
 * made resident again, evicting another, read back from the state
 * directory or its source file when its host copy was dropped) and
 * ls_pool_restore, with and without a state directory. */
#ifndef LS_TESTS_FAULT_CASES_H
#define LS_TESTS_FAULT_CASES_H

#include "tests/fault/fault_fixture.h"

typedef enum {
    FC_LOAD_NEW,     /* A, B resident, a slot free: load C (with a source path) */
    FC_LOAD_PINNED,  /* the same, C pinned */
    FC_LOAD_REPLACE, /* A, B resident: replace A (version 2, into A's slot) */
    FC_REPLACE_PINNED, /* A pinned, B resident: replace A, pinned (into A's slot) */
    FC_LOAD_EVICT,   /* A, B, C fill the slots: load D, evicting A */
    FC_DELETE,       /* A, B: delete A; then a load of A must be version 2 */
    FC_FORWARD,      /* A pinned, C, D resident, B not: 7 tokens over A B C D and base */
    FC_RESTORE,      /* a state directory of A (pinned), B v2, C, E, D deleted */
} fc_op;

typedef enum {
    FC_PLAIN,  /* no state directory */
    FC_STATE,  /* a state directory; in FC_FORWARD B's host copy is dropped and read back from it */
    FC_SOURCE, /* FC_FORWARD only: B comes from the adapter directory, dropped and read back from its file */
} fc_where;

typedef struct {
    const char *what;
    fc_op op;
    fc_where where;
} fc_spec;

/* Makes the adapter directory and the restore's state directory once. */
void fc_init(void);
void fc_fini(void);
/* fc_init and fc_fini as a cmocka group setup and teardown. */
int fc_group_setup(void **state);
int fc_group_teardown(void **state);

/* Every pool operation the sweeps cover, with and without a state
 * directory, in fc_op order. */
extern const fc_spec fc_specs[];
extern const size_t fc_n_specs;

/* The sweep's case for spec (which must outlive it). */
fx_case fc_case(const fc_spec *spec);

#endif
