/* The HTTP threads POST /adapters may hold. A load waits for the backend
 * while a forward runs on it, seconds for a large batch, and holds its
 * HTTP thread meanwhile: once every thread held one, /health and /ready
 * stopped answering and a load balancer took a healthy replica out. So
 * at most --http-threads - 1 loads run at once (one when there is one
 * thread); the next is 429 overloaded with Retry-After, which a client
 * retries. (A forward that auto-loads is not capped: see
 * handlers_forward.c.) */
#include <stdatomic.h>

#include "server/loads.h"
#include "server/metrics.h"

ls_status ls_server_load_begin(ls_server *srv, ls_error *err) {
    const int cap = srv->cfg.http_threads > 1 ? srv->cfg.http_threads - 1 : 1;
    int now = atomic_fetch_add(&srv->loads, 1);
    if (now >= cap) {
        atomic_fetch_sub(&srv->loads, 1);
        ls_metrics_overload(&srv->metrics);
        return ls_error_set(err, LS_OVERLOADED, "retry after a short wait: loads wait for the forward running now",
                            "%d adapter load(s) are already running; at most --http-threads - 1 = %d run at once, "
                            "so that an HTTP thread stays free for probes and forwards",
                            now, cap);
    }
    ls_metrics_set_loads(&srv->metrics, &srv->loads);
    return LS_OK;
}

void ls_server_load_end(ls_server *srv) {
    atomic_fetch_sub(&srv->loads, 1);
    ls_metrics_set_loads(&srv->metrics, &srv->loads);
}
