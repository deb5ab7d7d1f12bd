/* Which register tiles this CPU runs: detection (CPUID and the OS's saved
 * register state, through the compiler's cpu model) and the choice for
 * --cpu-isa (the paths' names are cpu_names.c's). */
#include <stddef.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "gpu/cpu/kernels.h"

#if defined(__x86_64__) || defined(__i386__)
/* F16C from CPUID itself: clang's __builtin_cpu_supports does not know
 * the name. Its instructions are VEX-encoded, so the AVX checks below
 * (which also ask the OS) cover the register state. */
static bool ls_cpu_has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
#endif

/* AVX512-BF16 (CPUID leaf 7, subleaf 1, EAX bit 5) with the AVX-512
 * parts the VDPBF16PS tiles are built for, whose register state the
 * compiler's checks ask the OS about. */
bool ls_cpu_has_avx512bf16(void) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
        !__builtin_cpu_supports("avx512vl"))
        return false;
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5));
#else
    return false;
#endif
}

bool ls_cpu_isa_supported(ls_cpu_isa isa) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    switch (isa) {
    case LS_CPU_ISA_AVX512:
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma") && ls_cpu_has_f16c();
    case LS_CPU_ISA_AVX2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && ls_cpu_has_f16c();
    case LS_CPU_ISA_AUTO:
    case LS_CPU_ISA_GENERIC: return true;
    }
    return false;
#else
    return isa == LS_CPU_ISA_AUTO || isa == LS_CPU_ISA_GENERIC;
#endif
}

const ls_cpu_kernels *ls_cpu_kernels_for(ls_cpu_isa isa) {
#if defined(__x86_64__) || defined(__i386__)
    if (isa == LS_CPU_ISA_AUTO) {
        if (ls_cpu_isa_supported(LS_CPU_ISA_AVX512)) return &ls_cpu_kernels_avx512;
        if (ls_cpu_isa_supported(LS_CPU_ISA_AVX2)) return &ls_cpu_kernels_avx2;
        return &ls_cpu_kernels_generic;
    }
    if (!ls_cpu_isa_supported(isa)) return NULL;
    switch (isa) {
    case LS_CPU_ISA_AVX512: return &ls_cpu_kernels_avx512;
    case LS_CPU_ISA_AVX2: return &ls_cpu_kernels_avx2;
    default: return &ls_cpu_kernels_generic;
    }
#else
    return ls_cpu_isa_supported(isa) ? &ls_cpu_kernels_generic : NULL;
#endif
}

const ls_cpu_kernels *ls_cpu_kernels_bf16_for(ls_cpu_isa isa) {
#if defined(__x86_64__) || defined(__i386__)
    const bool bf16x = ls_cpu_has_avx512bf16(), avx2 = ls_cpu_isa_supported(LS_CPU_ISA_AVX2);
    switch (isa) {
    case LS_CPU_ISA_AUTO: return bf16x ? &ls_cpu_kernels_avx512bf16 : avx2 ? &ls_cpu_kernels_avx2 : &ls_cpu_kernels_generic;
    case LS_CPU_ISA_AVX512: return bf16x ? &ls_cpu_kernels_avx512bf16 : NULL;
    case LS_CPU_ISA_AVX2: return avx2 ? &ls_cpu_kernels_avx2 : NULL;
    case LS_CPU_ISA_GENERIC: return &ls_cpu_kernels_generic;
    }
    return NULL;
#else
    return isa == LS_CPU_ISA_AUTO || isa == LS_CPU_ISA_GENERIC ? &ls_cpu_kernels_generic : NULL;
#endif
}
