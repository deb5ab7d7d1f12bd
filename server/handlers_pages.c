/* GET /dashboard and GET /openapi.json: files compiled into the binary by
 * ls_embed (web/dashboard.html, docs/openapi.json), so that a client reads
 * the page and the API description of the very binary it talks to.
 * /dashboard holds no data and is served without the API key (the page
 * sends the key on its fetches of /pool, /adapters and /metrics);
 * /openapi.json is behind the key like /metrics. */
#include "server/handlers.h"

/* Defined by the files ls_embed generates. */
extern const unsigned char ls_dashboard_html[];
extern const size_t ls_dashboard_html_len;
extern const unsigned char ls_openapi_json[];
extern const size_t ls_openapi_json_len;

void ls_handle_dashboard(const ls_request *req, ls_reply *r) {
    (void)req;
    ls_reply_copy(r, 200, ls_dashboard_html, ls_dashboard_html_len, "text/html; charset=utf-8");
}

void ls_handle_openapi(const ls_request *req, ls_reply *r) {
    (void)req;
    ls_reply_copy(r, 200, ls_openapi_json, ls_openapi_json_len, "application/json");
}
