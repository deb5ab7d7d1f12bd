/* The durable registry (--state-dir): every acknowledged adapter is on
 * disk before its reply and comes back after a restart (SIGKILL
 * included) with its version and sha256; deletes and replaces are durable
 * before their reply; a name's versions are never reused, also when its
 * record is damaged. Per name: NAME.adapter (a safetensors file: the
 * normalised factors, and as metadata what describes the adapter),
 * NAME.floor (the last version saved, written just after the record:
 * what keeps the name's versions once the record is deleted, or damaged
 * beyond reading) and NAME.deleted (the last version of a deleted name,
 * or of a record set aside as corrupt). A file is written under a
 * temporary name, synced, renamed into place and the directory synced,
 * so a crash leaves the old file or the new one, never a mix. One server
 * at a time: DIR/.lock is held (flock) for the state's life.
 * docs/reliability.md has the order of every write and what the disk
 * says when any step of it is refused. */
#ifndef LS_LORA_STATE_H
#define LS_LORA_STATE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/dims.h"
#include "common/error.h"
#include "lora/adapter.h"

typedef struct ls_state ls_state;

/* The highest version a name may reach: 2^63 - 1, so that every version
 * is a JSON integer as a client reads it (signed 64 bits) and none can
 * wrap. A file that gives a higher one is corrupt; a name at it takes no
 * new version (LS_VERSIONS_EXHAUSTED). */
#define LS_STATE_VERSION_MAX ((uint64_t)INT64_MAX)

/* Opens (creating it if needed) the state directory and takes its lock
 * (DIR/.lock, held until ls_state_close): a second server on the same
 * directory is refused (LS_INVALID_REQUEST, naming the directory and the
 * holder's pid). On success *out is the caller's (ls_state_close). */
ls_status ls_state_open(const char *dir, ls_state **out, ls_error *err);
void ls_state_close(ls_state *s);

/* Bounds what reading takes to the largest record a pool of these shapes
 * could hold (its layers of factors at the pool's rank and layout, plus
 * the largest safetensors header): a larger file is never read whole.
 * The pool calls it at creation; until then nothing is bounded but by
 * the address space. */
void ls_state_fit(ls_state *s, const ls_dims *d, const ls_pool_dims *pd);

/* One adapter as it is saved and restored. */
typedef struct {
    const char *name;
    uint64_t version;
    bool pinned;
    bool auto_loaded;        /* registered by --auto-load */
    const char *source_path; /* relative to the adapter directory; NULL for inline uploads */
    ls_adapter_params params; /* what it was loaded with */
    const ls_adapter *a;
} ls_state_record;

/* Makes rec durable as NAME.adapter (replacing an older version). The
 * record and, unless it holds this version already, NAME.floor are
 * written to temporary files and synced first (a full disk fails here,
 * changing nothing and leaving nothing); then the record is renamed into
 * place (the step that makes the save), then the floor, then a
 * NAME.deleted is dropped (best effort: one left behind is older than
 * the record, and a restore ignores it). *made says whether the record is
 * in place: true on LS_OK; on a failure (LS_INSUFFICIENT_STORAGE for a
 * full disk or quota, LS_INTERNAL, or LS_INVALID_REQUEST for a name that
 * breaks the name rule) true only
 * when the rename happened and the sync of the directory after it
 * failed: the disk then says the new version, and the caller must say
 * the same (register it) while it reports the error. When *made is false
 * nothing changed. */
ls_status ls_state_save(ls_state *s, const ls_state_record *rec, bool *made, ls_error *err);

/* Makes the delete of NAME (whose last version was version) durable:
 * NAME.floor is made to hold version if it does not (the only write that
 * needs space, and only after a crash between a save's record and its
 * floor since the last start, or for a record saved before floors), then
 * NAME.adapter is removed (the step that makes the delete: it frees
 * space, so a full disk can delete), then NAME.deleted is written (best
 * effort: the floor keeps the versions without it). *made as for
 * ls_state_save: true when the record is gone, also when only the sync
 * after its removal failed. */
ls_status ls_state_forget(ls_state *s, const char *name, uint64_t version, bool *made, ls_error *err);

/* Reads NAME.adapter back into out (the caller's, ls_adapter_free) when
 * it holds version; its digest is checked. The host tier's reload. */
ls_status ls_state_read(ls_state *s, const char *name, uint64_t version, ls_adapter *out, ls_error *err);

/* Called once per saved adapter at restore; a (also rec->a) is fn's to
 * take by zeroing it, else it is freed after the call. */
typedef ls_status (*ls_state_restore_fn)(void *ctx, const ls_state_record *rec, ls_adapter *a, ls_error *err);
/* Called with a version the name's next one must go above: once per
 * deleted name with its last version (its tombstone's, or the floor of a
 * name without a record), and once per record set aside or kept unread
 * with the highest version it could have held (a name may be told of
 * more than one: the highest counts). */
typedef void (*ls_state_tomb_fn)(void *ctx, const char *name, uint64_t version);

/* Reads the directory: every NAME.deleted and NAME.floor (the floor of a
 * name without a record is its deleted version), then every NAME.adapter
 * in name order. A file that cannot be read as what it should be (not a
 * regular file, larger than any record this pool could hold, truncated,
 * corrupt, a digest that does not match, a version above
 * LS_STATE_VERSION_MAX, a scale that is not finite, a name that breaks
 * the name rule in the file's name or in the record) is moved to
 * DIR/corrupt/ (opened without following links; when it is not a
 * directory the file stays where it is) with a log line and skipped: it
 * never stops start-up, and no file is opened in a way that can block. A
 * record larger than this pool could hold whose header says it is one
 * of another model or pool shape is kept in place and skipped, its
 * version taken, as a record of another shape that reads is. A record
 * set aside keeps its name's versions: the version its header still
 * gives, or else NAME.floor's, becomes the name's NAME.deleted (durably,
 * before the record moves; where the disk refuses, the record stays in
 * place for the next start) and goes to tomb. Only a record whose header
 * is lost and whose name has no floor that reads (one saved before
 * floors existed) leaves no version (its log line says so), and one
 * whose name breaks the rule keeps none (no upload can use the name).
 * After a record is restored, a floor behind it is moved up and an older
 * tombstone dropped (best effort). An error of fn stops the restore and
 * is returned. */
ls_status ls_state_restore(ls_state *s, ls_state_restore_fn fn, ls_state_tomb_fn tomb, void *ctx, ls_error *err);
/* Records (NAME.adapter files) the restore did not register: set aside,
 * kept for another model or pool shape, or skipped by fn, which says so
 * with ls_state_note_unrestored. Each was an adapter a client was told
 * is stored. */
int ls_state_unrestored(const ls_state *s);
void ls_state_note_unrestored(ls_state *s);

#endif
