/* The server's settings. One table in settings.c (name, type, default,
 * bounds, help) drives the command-line flags, the LORASINK_* environment
 * variables, the JSON config file (read in config.c), --help and the dump
 * of the effective configuration. Precedence: flag > environment > file >
 * default. */
#ifndef LS_CONFIG_CONFIG_H
#define LS_CONFIG_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/dims.h"
#include "common/log.h"
#include "common/tensor.h"
#include "gpu/cpu/cpu_backend.h" /* ls_cpu_isa, ls_cpu_compute: the CPU backend's own enums */

/* The version is project(VERSION) in CMakeLists.txt, the only place it is
 * written. */
#ifndef LS_VERSION
#error "LS_VERSION is defined by the build (CMakeLists.txt, project VERSION)"
#endif
#define LS_CONFIG_PATH_MAX 4096
/* --adapter entries: their text, one per line. */
#define LS_CONFIG_ADAPTERS_MAX 65536

typedef enum { LS_DEVICE_AUTO, LS_DEVICE_CPU, LS_DEVICE_CUDA } ls_device_kind;

/* dtype "auto": the weights file's dtype, bf16 for the demo model. */
typedef enum { LS_WDTYPE_AUTO, LS_WDTYPE_BF16, LS_WDTYPE_F16, LS_WDTYPE_F32 } ls_weight_dtype;

typedef struct {
    char config_file[LS_CONFIG_PATH_MAX]; /* "" = none */
    char host[256];
    int port; /* 0 = ephemeral */
    ls_device_kind device;
    int threads; /* CPU engine threads; 0 = every CPU the process may use */
    ls_cpu_isa cpu_isa;         /* CPU kernel path, as the CPU backend takes it */
    int cuda_graphs;            /* forward shapes the CUDA backend keeps as graphs; 0 = none */
    ls_cpu_compute compute;     /* CPU arithmetic, as the CPU backend takes it */

    char weights[LS_CONFIG_PATH_MAX]; /* "" = demo model */
    bool demo;
    int experts, hidden, intermediate, layers;
    uint64_t seed;
    ls_w13_layout w13_layout;
    bool w13_layout_set; /* given by flag, env or file (overrides __metadata__) */
    ls_weight_dtype dtype;

    int slots, max_rank;
    ls_lora_layout lora_layout;
    int host_cache;
    char adapter_dir[LS_CONFIG_PATH_MAX]; /* "" = working directory */
    char state_dir[LS_CONFIG_PATH_MAX];   /* "" = no durable registry */
    char adapters[LS_CONFIG_ADAPTERS_MAX]; /* --adapter NAME=PATH[,pinned], one per line; ls_config_adapter_next */
    bool strict_adapters;
    bool auto_load; /* forwards register adapters found in adapter_dir by name */
    int max_adapter_mb; /* largest adapter file read from adapter_dir, MiB */
    int max_body_mb;
    char api_key[512]; /* "" = no auth */
    char tls_cert[LS_CONFIG_PATH_MAX];      /* PEM chain; "" = plain HTTP (server/tls.h) */
    char tls_key[LS_CONFIG_PATH_MAX];       /* PEM key of tls_cert; given with it */
    char tls_client_ca[LS_CONFIG_PATH_MAX]; /* PEM CAs client certificates must chain to; "" = none asked */
    char api_keys[LS_CONFIG_PATH_MAX]; /* --api-keys FILE: keys per tenant (server/tenant.h); "" = none */
    int max_batch_tokens;
    int batch_wait_us;
    int max_queue_tokens; /* bound of the batcher's queue */
    int max_request_tokens; /* rows of x one /forward may carry */
    int max_queue_mb;       /* bytes all /forward requests in flight may hold, MiB */
    int max_upload_mb;      /* bytes the other requests' bodies may hold at once, MiB */
    bool batching;        /* false: each /forward runs alone */
    int http_threads;

    int max_connections;
    int per_ip_connections;
    int connection_timeout_s;
    int request_timeout_s; /* from a head's first byte to its end */
    int body_timeout_s;    /* from a head's end to its body's */
    char allowed_hosts[1024];   /* names Host may carry besides IP literals and localhost; "*" = any */
    char allowed_origins[1024]; /* origins besides the server's own whose pages may call it; "*" = any */
    int shutdown_timeout_s; /* how long a stop waits for clients, not for replies the server owes */
    ls_log_level log_level;
    bool access_log; /* one line per request on stderr */
    /* The peers' flag names the command line used, as read ("--max-lora-rank
     * as --max-rank, ..."; "" for none), for the start-up log. Not a setting. */
    char aliases_used[256];
    /* LORASINK_* variables that are not read but look meant to be (near a
     * setting's name, or a peer's flag as a variable), each with what is
     * read instead, for a start-up warning; "" for none. Not a setting. */
    char env_unread[512];
    /* --probe: ask a running server's GET /ready and exit (server/probe.h)
     * instead of serving. A command-line action, as --help is: never read
     * from the environment or a file, so no setting can stop a server. */
    bool probe;
} ls_config;

typedef enum {
    LS_CONFIG_RUN,   /* settings are ready: start the server */
    LS_CONFIG_EXIT,  /* --help or --version was printed: exit 0 */
    LS_CONFIG_ERROR, /* errbuf holds a one-line error: exit 2 */
} ls_config_result;

/* Fills cfg from defaults, then the file (--config or LORASINK_CONFIG),
 * then the environment (envp, NULL-terminated "KEY=VALUE"), then argv.
 * Prints --help / --version to out. */
ls_config_result ls_config_load(ls_config *cfg, int argc, char **argv, char **envp, FILE *out, char *errbuf,
                                size_t errlen);

/* Writes every setting with its value as one JSON object (api_key masked). */
void ls_config_dump(const ls_config *cfg, FILE *out);

/* One --adapter entry: NAME=PATH, optionally ",pinned". */
typedef struct {
    char name[129];
    char path[LS_CONFIG_PATH_MAX];
    bool pinned;
} ls_config_adapter;

/* Walks cfg->adapters: *cursor starts at cfg->adapters; each call fills
 * out with the next entry and returns true, false after the last. The
 * entries were checked when they were set. */
bool ls_config_adapter_next(const char **cursor, ls_config_adapter *out);

const char *ls_device_kind_name(ls_device_kind d);
const char *ls_weight_dtype_name(ls_weight_dtype d);

#endif
