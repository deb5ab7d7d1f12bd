/* The durable registry (--state-dir): every acknowledged adapter is on
 * disk before its reply and comes back after a restart (SIGKILL
 * included) with its version and sha256; deletes and replaces are durable
 * before their reply; a name's versions are never reused, also when its
 * record is damaged. Per name: NAME.adapter (a safetensors file: the
 * normalised factors, and as metadata what describes the adapter) or
 * NAME.deleted (the last version of a deleted name, or of a record set
 * aside as corrupt), and NAME.floor (the last version saved, written
 * before the record: what is left of the versions when even the
 * record's header is lost). A file is written under a temporary name,
 * synced, renamed into place and the directory synced, so a crash leaves
 * the old file or the new one, never a mix. */
#ifndef LS_LORA_STATE_H
#define LS_LORA_STATE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"
#include "lora/adapter.h"

typedef struct ls_state ls_state;

/* Opens (creating it if needed) the state directory. On success *out is
 * the caller's (ls_state_close). */
ls_status ls_state_open(const char *dir, ls_state **out, ls_error *err);
void ls_state_close(ls_state *s);

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

/* Makes rec durable as NAME.adapter (replacing an older version), its
 * version as NAME.floor first, and drops a NAME.deleted. LS_INTERNAL
 * when the disk refuses; then nothing on disk changed but, maybe,
 * NAME.floor (a floor ahead of every record is harmless: it only bounds
 * the name's next version from below). */
ls_status ls_state_save(ls_state *s, const ls_state_record *rec, ls_error *err);

/* Makes the delete of NAME (whose last version was version) durable:
 * NAME.deleted first, then NAME.adapter removed. */
ls_status ls_state_forget(ls_state *s, const char *name, uint64_t version, ls_error *err);

/* Reads NAME.adapter back into out (the caller's, ls_adapter_free) when
 * it holds version; its digest is checked. The host tier's reload. */
ls_status ls_state_read(ls_state *s, const char *name, uint64_t version, ls_adapter *out, ls_error *err);

/* Called once per saved adapter at restore; a (also rec->a) is fn's to
 * take by zeroing it, else it is freed after the call. */
typedef ls_status (*ls_state_restore_fn)(void *ctx, const ls_state_record *rec, ls_adapter *a, ls_error *err);
/* Called with a version the name's next one must go above: once per
 * deleted name with its last version, and once per record set aside
 * with the highest version it could have held (a name may be told of
 * both: the higher counts). */
typedef void (*ls_state_tomb_fn)(void *ctx, const char *name, uint64_t version);

/* Reads the directory: every NAME.deleted, then every NAME.adapter in
 * name order. A file that cannot be read as what it should be (truncated,
 * corrupt, a digest that does not match) is moved to DIR/corrupt/ with a
 * log line and skipped: it never stops start-up. A record set aside keeps
 * its name's versions: the version its header still gives, or else
 * NAME.floor's, becomes the name's NAME.deleted (durably, before the
 * record moves; where the disk refuses, the record stays in place for
 * the next start) and goes to tomb. Only a record whose header is lost
 * and whose name has no floor that reads (one saved before floors
 * existed) leaves no version (its log line says so). An error of fn
 * stops the restore and is returned. */
ls_status ls_state_restore(ls_state *s, ls_state_restore_fn fn, ls_state_tomb_fn tomb, void *ctx, ls_error *err);

#endif
