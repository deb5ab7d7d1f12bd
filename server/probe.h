/* lorasink --probe: a container's health check. Asks the server that a
 * configuration describes (its --host and --port, HTTPS when it names
 * --tls-cert) for GET /ready and answers with the exit status. */
#ifndef LS_SERVER_PROBE_H
#define LS_SERVER_PROBE_H

#include "config/config.h"

/* 0 when GET /ready answered 200 (its body printed on stdout), 1 otherwise
 * (one line on stderr says why), all within 2.5 s. A server bound to
 * every address is asked on the loopback. Over HTTPS the server's
 * certificate is not verified: the probe only asks whether this host's
 * server is ready. With
 * --tls-client-ca it shows --tls-cert and --tls-key as its own
 * certificate, which works where that CA signed them. */
int ls_probe_run(const ls_config *cfg);

#endif
