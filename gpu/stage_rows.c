/* Token rows gathered and rounded into staging, and y scattered back
 * (gpu/stage_rows.h). */
#include "gpu/stage_rows.h"

#include <stdint.h>
#include <string.h>

#include "gpu/parallel_rows.h"

/* ls_f32_to_bf16, the same bits for every input, NaN included. */
static void stage_bf16_scalar(uint16_t *restrict d, const float *restrict s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &s[i], sizeof u);
        const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
        const uint32_t quiet = (u >> 16) | 0x40u;
        d[i] = (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
    }
}

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define LS_STAGE_X86 1

/* Eight floats' bf16 bits in the low halves of eight lanes, as
 * stage_bf16_scalar rounds them. VCVTNEPS2BF16 is not used: it reads
 * denormals as zero, which the device's rounding does not. */
__attribute__((target("avx2"))) static inline __m256i bf16_bits8(const float *s) {
    const __m256i u = _mm256_loadu_si256((const __m256i *)(const void *)s);
    const __m256i hi = _mm256_srli_epi32(u, 16);
    const __m256i odd = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd), 16);
    const __m256i quiet = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    const __m256i mag = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    const __m256i nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7f800000));
    return _mm256_blendv_epi8(rounded, quiet, nan);
}

/* Sixteen at a time: two sets of eight packed to 16 bits (each value fits
 * unsigned 16 bits, so the saturating pack keeps it), then the 64-bit
 * quarters put back in order (the pack works per 128-bit half). */
__attribute__((target("avx2"))) static void stage_bf16_avx2(uint16_t *restrict d, const float *restrict s, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256i packed = _mm256_packus_epi32(bf16_bits8(s + i), bf16_bits8(s + i + 8));
        _mm256_storeu_si256((__m256i *)(void *)(d + i), _mm256_permute4x64_epi64(packed, 0xd8));
    }
    stage_bf16_scalar(d + i, s + i, n - i);
}

/* The same rounding sixteen lanes wide, narrowed by VPMOVDW. */
__attribute__((target("avx512f"))) static void stage_bf16_avx512(uint16_t *restrict d, const float *restrict s,
                                                                   size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512i u = _mm512_loadu_si512((const void *)(s + i));
        const __m512i hi = _mm512_srli_epi32(u, 16);
        const __m512i odd = _mm512_and_si512(hi, _mm512_set1_epi32(1));
        const __m512i rounded =
            _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd), 16);
        const __m512i quiet = _mm512_or_si512(hi, _mm512_set1_epi32(0x40));
        const __mmask16 nan =
            _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
        _mm256_storeu_si256((__m256i *)(void *)(d + i), _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet)));
    }
    stage_bf16_scalar(d + i, s + i, n - i);
}
#else
#define LS_STAGE_X86 0
#endif

bool ls_stage_isa_supported(ls_stage_isa isa) {
#if LS_STAGE_X86
    __builtin_cpu_init();
    if (isa == LS_STAGE_AVX512) return __builtin_cpu_supports("avx512f");
    if (isa == LS_STAGE_AVX2) return __builtin_cpu_supports("avx2");
#endif
    return isa == LS_STAGE_AUTO || isa == LS_STAGE_SCALAR;
}

static ls_stage_isa stage_pick(ls_stage_isa isa) {
    if (isa != LS_STAGE_AUTO) return isa;
    if (ls_stage_isa_supported(LS_STAGE_AVX512)) return LS_STAGE_AVX512;
    if (ls_stage_isa_supported(LS_STAGE_AVX2)) return LS_STAGE_AVX2;
    return LS_STAGE_SCALAR;
}

static void stage_bf16(uint16_t *restrict d, const float *restrict s, size_t n, ls_stage_isa isa) {
#if LS_STAGE_X86
    if (isa == LS_STAGE_AVX512) {
        stage_bf16_avx512(d, s, n);
        return;
    }
    if (isa == LS_STAGE_AVX2) {
        stage_bf16_avx2(d, s, n);
        return;
    }
#endif
    (void)isa;
    stage_bf16_scalar(d, s, n);
}

typedef struct {
    char *dst;
    ls_dtype dt;
    const float *src;
    const int *order;
    size_t H;
    ls_stage_isa isa;
} stage_job;

static void stage_range(void *ctx, size_t r0, size_t r1) {
    const stage_job *j = (const stage_job *)ctx;
    const size_t esz = ls_dtype_size(j->dt);
    for (size_t i = r0; i < r1; i++) {
        const float *s = j->src + (size_t)j->order[i] * j->H;
        char *d = j->dst + i * j->H * esz;
        if (j->dt == LS_DTYPE_BF16)
            stage_bf16((uint16_t *)(void *)d, s, j->H, j->isa);
        else if (j->dt == LS_DTYPE_F16)
            ls_convert_from_f32(LS_DTYPE_F16, s, j->H, d);
        else
            memcpy(d, s, j->H * sizeof(float));
    }
}

static int stage_threads(size_t T, size_t H) { return T * H >= LS_STAGE_ROWS_THREADED ? ls_parallel_rows_threads() : 1; }

void ls_stage_rows_isa(void *dst, ls_dtype dt, const float *src, const int *order, size_t T, size_t H,
                       ls_stage_isa isa) {
    stage_job j = {(char *)dst, dt, src, order, H, stage_pick(isa)};
    ls_parallel_rows(T, stage_threads(T, H), stage_range, &j);
}

void ls_stage_rows(void *dst, ls_dtype dt, const float *src, const int *order, size_t T, size_t H) {
    ls_stage_rows_isa(dst, dt, src, order, T, H, LS_STAGE_AUTO);
}

typedef struct {
    float *y;
    const float *staged;
    const int *order;
    size_t H;
} unstage_job;

static void unstage_range(void *ctx, size_t r0, size_t r1) {
    const unstage_job *j = (const unstage_job *)ctx;
    for (size_t i = r0; i < r1; i++)
        memcpy(j->y + (size_t)j->order[i] * j->H, j->staged + i * j->H, j->H * sizeof(float));
}

void ls_unstage_rows(float *y, const float *staged, const int *order, size_t T, size_t H) {
    unstage_job j = {y, staged, order, H};
    ls_parallel_rows(T, stage_threads(T, H), unstage_range, &j);
}
