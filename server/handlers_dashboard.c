/* GET /dashboard: the operator's page (web/dashboard.html, compiled in by
 * ls_embed). The page holds no data, so the route is served without the
 * API key; the page itself sends the key on its fetches of /pool,
 * /adapters and /metrics. */
#include <stdlib.h>
#include <string.h>

#include "server/request.h"

/* Defined by the file ls_embed generates from web/dashboard.html. */
extern const unsigned char ls_dashboard_html[];
extern const size_t ls_dashboard_html_len;

/* r->body receives a malloc'd copy of the page (http.c frees every reply
 * body the same way). */
void ls_handle_dashboard(const ls_request *req, ls_reply *r) {
    (void)req;
    char *body = malloc(ls_dashboard_html_len + 1);
    if (!body) {
        ls_reply_fail(r, LS_INTERNAL, NULL, "out of memory serving the dashboard");
        return;
    }
    memcpy(body, ls_dashboard_html, ls_dashboard_html_len + 1);
    r->status = 200;
    r->body = body;
    r->len = ls_dashboard_html_len;
    r->content_type = "text/html; charset=utf-8";
}
