/* The adapters a forward's tokens name: each distinct name once, in the
 * order tokens first name it, and per token an index into them. A request
 * is parsed into one, the pool resolves each distinct name once, and
 * results (the used[] of ls_pool_forward, entry k for names[k]) and
 * metrics map back by index, never by comparing strings per token. */
#ifndef LS_LORA_TOKEN_NAMES_H
#define LS_LORA_TOKEN_NAMES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    int T;              /* tokens */
    int n;              /* distinct names; every one is named by a token */
    const char **names; /* [n], in order of first use */
    int *of_token;      /* [T]: an index into names, -1 for the base model; NULL: no token names one */
    size_t name_bytes;  /* the names' bytes with their NULs */
    /* how it is built */
    bool borrow;        /* the names outlive the table, which borrows them; else it holds copies */
    int names_cap, tokens_cap;
    int *slot;          /* open-addressed hash of names: index + 1, 0 when empty */
    int slot_cap;       /* a power of two, over twice n */
} ls_token_names;

/* One distinct adapter a forward used: the record of the pool's answer,
 * of the batcher's, the metrics' and the reply's. name is borrowed from
 * the forward's table (it lives as long as the table). */
typedef struct {
    const char *name;
    uint64_t version;
    int slot;
} ls_pool_used;

/* An empty table (of_token NULL); borrow: whether added names are
 * borrowed rather than copied. A zeroed table is an empty one that
 * copies. */
void ls_token_names_init(ls_token_names *tn, bool borrow);
/* Frees every buffer (and the copies), leaving an empty table. */
void ls_token_names_free(ls_token_names *tn);
/* Empties the table, keeping its buffers for the next one. */
void ls_token_names_reset(ls_token_names *tn);

/* The index of name (which must outlive the table when it borrows),
 * added when new; -1 when out of memory. Call it for a name only when a
 * token is about to name it, so every name has a token. */
int ls_token_names_index(ls_token_names *tn, const char *name);
/* Appends a token naming names[index] (-1: the base model), allocating
 * of_token on the first; false when out of memory. */
bool ls_token_names_push(ls_token_names *tn, int index);
/* T tokens all naming name (copied or borrowed as the table says), on an
 * empty table; false when out of memory. */
bool ls_token_names_fill(ls_token_names *tn, const char *name, int T);

/* Whether some token names no adapter (of_token NULL: every one). */
bool ls_token_names_any_base(const ls_token_names *tn);

#endif
