/* The requests that run in steps on several threads (server/routes.h's
 * LS_STEPS_FORWARD and LS_STEPS_LOAD): each step's entry point, which
 * server/http.c calls on the thread the step runs on. */
#ifndef LS_SERVER_JOBS_H
#define LS_SERVER_JOBS_H

#include "server/request.h"

/* The asynchronous form of /forward used with the batcher: prepare parses
 * and admits the request (NULL with r filled on error), the batch job
 * runs, complete fills r and frees the job's tensors (its bytes leave
 * --max-queue-mb's budget). The job is owned by the caller until
 * ls_forward_job_free. With --auto-load an adapter the forward names may
 * have to be loaded first, which never happens on the thread that
 * prepared it: *next says what is left, each step on a thread that may do
 * it, in this order:
 *   LS_FORWARD_READ   ls_forward_read: read and validate adapter files (the disk)
 *   LS_FORWARD_LOAD   ls_forward_load: register them, or wait for another
 *                     request's load (the backend)
 *   LS_FORWARD_BATCH  ready for the batch
 * A step that answers (an error) fills r and gives LS_FORWARD_ANSWERED. */
typedef enum { LS_FORWARD_ANSWERED, LS_FORWARD_BATCH, LS_FORWARD_READ, LS_FORWARD_LOAD } ls_forward_step;
typedef struct ls_forward_job ls_forward_job;
struct ls_batch_job;
ls_forward_job *ls_forward_prepare(const ls_request *req, ls_forward_step *next, ls_reply *r);
ls_forward_step ls_forward_read(ls_forward_job *fj, ls_reply *r);
ls_forward_step ls_forward_load(ls_forward_job *fj, ls_reply *r);
/* After the batch: true when the forward goes again. It failed with
 * adapter_not_found on a server that auto-loads, so an adapter it loaded
 * may have been deleted before the batch looked it up, and a forward
 * after a delete loads the name again (at most a few times). Then
 * ls_forward_restart, on a thread that may read the disk, takes the
 * look prepare took and gives the next step (READ, LOAD, BATCH, or
 * ANSWERED with r filled: the file is gone now, say). */
bool ls_forward_again(const ls_forward_job *fj);
ls_forward_step ls_forward_restart(ls_forward_job *fj, ls_reply *r);
struct ls_batch_job *ls_forward_batch_job(ls_forward_job *fj);
void ls_forward_complete(ls_server *srv, ls_forward_job *fj, ls_reply *r);
void ls_forward_job_free(ls_forward_job *fj);

/* POST /adapters in two steps, so that an upload's errors never wait for
 * the backend: prepare parses and validates (it may read the disk; NULL
 * with r filled on error), commit registers it (it may wait for the
 * forward on the backend), fills r and frees the job. Counted in the
 * loads gauge from prepare until the job is freed. */
typedef struct ls_adapter_load_job ls_adapter_load_job;
ls_adapter_load_job *ls_adapter_load_prepare(const ls_request *req, ls_reply *r);
void ls_adapter_load_commit(ls_adapter_load_job *j, ls_reply *r);
void ls_adapter_load_job_free(ls_adapter_load_job *j);

#endif
