/* The names of the CPU backend's choices (--cpu-isa, --compute), apart
 * from the code that acts on them: the settings table reads them, and a
 * build of config/ alone (the fuzz harnesses) links them without the
 * kernels. */
#include <stddef.h>

#include "gpu/cpu/cpu_backend.h"

const char *const ls_cpu_isa_names[] = {"auto", "avx512", "avx2", "generic", NULL};

const char *ls_cpu_isa_name(ls_cpu_isa isa) {
    return (unsigned)isa <= (unsigned)LS_CPU_ISA_GENERIC ? ls_cpu_isa_names[isa] : "?";
}

const char *const ls_cpu_compute_names[] = {"f32", "bf16", NULL};

const char *ls_cpu_compute_name(ls_cpu_compute compute) {
    return (unsigned)compute <= (unsigned)LS_CPU_COMPUTE_BF16 ? ls_cpu_compute_names[compute] : "?";
}
