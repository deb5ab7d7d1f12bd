/* A thread that calls a function every period until stopped: the
 * watchers of files that are re-read when they change (--api-keys, the
 * TLS certificates). */
#ifndef LS_COMMON_TICKER_H
#define LS_COMMON_TICKER_H

typedef struct ls_ticker ls_ticker;

/* Starts a thread calling fn(ctx) every period_ms (the first call one
 * period from now), never two calls at once. ctx is borrowed and must
 * outlive ls_ticker_stop. NULL when the thread cannot be started. */
ls_ticker *ls_ticker_start(int period_ms, void (*fn)(void *ctx), void *ctx);
/* Stops the calls (waiting for one under way) and frees t; NULL is a
 * no-op. */
void ls_ticker_stop(ls_ticker *t);

#endif
