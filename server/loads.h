/* The budget of HTTP threads adapter loads may hold (server/loads.c). */
#ifndef LS_SERVER_LOADS_H
#define LS_SERVER_LOADS_H

#include "common/error.h"
#include "server/server.h"

/* LS_OK when this load may run (end it with ls_server_load_end), else
 * LS_OVERLOADED in err (429 with Retry-After) and nothing to end. */
ls_status ls_server_load_begin(ls_server *srv, ls_error *err);
void ls_server_load_end(ls_server *srv);

#endif
