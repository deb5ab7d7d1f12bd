/* What the CPU backend offers beyond gpu/backend.h: its own settings (the
 * kernel path, --cpu-isa, the arithmetic, --compute, and the engine's
 * threads, --threads) and its
 * constructor. The settings' enum is the one the configuration holds
 * (config/config.h), so a choice goes from the command line to the engine
 * without a second enum to map it through. */
#ifndef LS_GPU_CPU_CPU_BACKEND_H
#define LS_GPU_CPU_CPU_BACKEND_H

#include <stdbool.h>

#include "gpu/backend.h"

/* The CPU backend's kernel paths (--cpu-isa). Every path gives the same
 * bits; AUTO takes the widest the CPU runs. */
typedef enum { LS_CPU_ISA_AUTO, LS_CPU_ISA_AVX512, LS_CPU_ISA_AVX2, LS_CPU_ISA_GENERIC } ls_cpu_isa;

/* The paths' names in the enum's order, NULL-terminated (the settings
 * table's choices): "auto", "avx512", "avx2", "generic". */
extern const char *const ls_cpu_isa_names[];
/* One of those names; "?" for a value outside the enum. */
const char *ls_cpu_isa_name(ls_cpu_isa isa);
/* True when this CPU (and OS) runs the path; AUTO and GENERIC always. */
bool ls_cpu_isa_supported(ls_cpu_isa isa);

/* The CPU backend's arithmetic (--compute): fp32 throughout, or bf16
 * operands with fp32 sums (docs/math.md, "bf16 compute"). */
typedef enum { LS_CPU_COMPUTE_F32, LS_CPU_COMPUTE_BF16 } ls_cpu_compute;

/* The modes' names in the enum's order, NULL-terminated: "f32", "bf16". */
extern const char *const ls_cpu_compute_names[];
/* One of those names; "?" for a value outside the enum. */
const char *ls_cpu_compute_name(ls_cpu_compute compute);

/* The CPU backend's own settings; all zero is the default. */
typedef struct {
    int threads;            /* engine threads; 0 = every CPU the process may run on */
    ls_cpu_isa isa;         /* kernel path */
    ls_cpu_compute compute; /* arithmetic */
} ls_cpu_settings;

/* Creates the CPU backend: allocates the pool buffers and scratch for
 * max_tokens tokens once and starts the engine's threads. cpu NULL: the
 * defaults. An isa the CPU does not run is LS_INVALID_REQUEST. On success
 * *out is owned by the caller and released with ls_backend_free. */
ls_status ls_backend_cpu_create(const ls_backend_config *cfg, const ls_cpu_settings *cpu, ls_backend **out,
                                ls_error *err);

#endif
