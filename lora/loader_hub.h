/* A Hugging Face repo id ("org/name") given as an adapter path, found in
 * a hub cache at the adapter directory: the snapshot its refs/main names.
 * Nothing is downloaded. Private to lora/loader.c. */
#ifndef LS_LORA_LOADER_HUB_H
#define LS_LORA_LOADER_HUB_H

#include <stdbool.h>
#include <stddef.h>

#include "common/error.h"

/* rel (relative to dirfd, borrowed) when it does not exist there and reads
 * as a repo id that the cache holds: out set to its snapshot's path
 * ("models--org--name/snapshots/<commit>"), or an error when the cache
 * holds the repo but no usable refs/main. Otherwise LS_OK with out "". */
ls_status ls_loader_hub_snapshot(int dirfd, const char *rel, char *out, size_t len, ls_error *err);

/* True when rel reads as a repo id: one '/', each side a name of
 * letters, digits, '-', '_' and '.', no "--" or "..". */
bool ls_loader_hub_repo_id(const char *rel);

#endif
