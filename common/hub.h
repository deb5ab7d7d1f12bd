/* A Hugging Face repo id ("org/name") given where a path is expected (an
 * adapter path, --weights), found in a hub cache: the snapshot its
 * refs/main names. Nothing is downloaded. */
#ifndef LS_COMMON_HUB_H
#define LS_COMMON_HUB_H

#include <stdbool.h>
#include <stddef.h>

#include "common/error.h"

/* rel (relative to dirfd, borrowed) when it does not exist there and reads
 * as a repo id that the cache holds: out set to its snapshot's path
 * ("models--org--name/snapshots/<commit>"), or an error when the cache
 * holds the repo but no usable refs/main. Otherwise LS_OK with out "". */
ls_status ls_hub_snapshot(int dirfd, const char *rel, char *out, size_t len, ls_error *err);

/* True when rel reads as a repo id: one '/', each side a name of
 * letters, digits, '-', '_' and '.', no "--" or "..". */
bool ls_hub_repo_id(const char *rel);

/* The hub cache huggingface_hub uses, into out: $HF_HUB_CACHE, else
 * $HUGGINGFACE_HUB_CACHE (its older name), else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
 * $HOME/.cache/huggingface/hub. */
void ls_hub_cache_dir(char *out, size_t len);

#endif
