/* The CUDA forward's host staging alone (gpu/stage_rows.h), on the CPU:
 * the gather of T token rows in a shuffled order into staging rounded to
 * bf16, beside the plain fp32 gather it replaced, per way of rounding
 * this CPU runs, and y's scatter back. Prints a markdown table of median
 * microseconds and the ratio bf16 / fp32; never passes or fails on time.
 *   bench_stage [H]      (default 7168, DeepSeek-V3's hidden size) */
#include <stdio.h>
#include <stdlib.h>

#include "bench_util.h"
#include "gpu/stage_rows.h"

static const char *const isa_names[] = {"auto", "avx512", "avx2", "scalar"};

typedef struct {
    float *x, *y, *staged_f32;
    void *staged;
    int *order;
    size_t H;
} stage_bufs;

/* Median µs of `reps` calls (after one untimed) of one staging. what: 0
 * bf16 gather by isa, 1 fp32 gather, 2 scatter. */
static double time_us(const stage_bufs *b, size_t T, int what, ls_stage_isa isa, int reps) {
    double t[64];
    for (int i = -1; i < reps; i++) {
        const double t0 = bench_now_ms();
        if (what == 0) ls_stage_rows_isa(b->staged, LS_DTYPE_BF16, b->x, b->order, T, b->H, isa);
        else if (what == 1) ls_stage_rows(b->staged_f32, LS_DTYPE_F32, b->x, b->order, T, b->H);
        else ls_unstage_rows(b->y, b->staged_f32, b->order, T, b->H);
        if (i >= 0) t[i] = (bench_now_ms() - t0) * 1e3;
    }
    return bench_median(t, reps);
}

int main(int argc, char **argv) {
    const size_t H = argc > 1 ? (size_t)atol(argv[1]) : 7168;
    const size_t Ts[] = {1, 64, 512, 4096}, Tmax = 4096;
    stage_bufs b = {malloc(Tmax * H * 4), malloc(Tmax * H * 4), malloc(Tmax * H * 4), malloc(Tmax * H * 2),
                    malloc(Tmax * sizeof(int)), H};
    if (H < 1 || !b.x || !b.y || !b.staged_f32 || !b.staged || !b.order) {
        fprintf(stderr, "bench_stage: usage: bench_stage [H >= 1]; or out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < Tmax * H; i++) b.x[i] = (float)(i % 1000) * 1e-3f - 0.5f;
    printf("host staging of the CUDA forward, H = %zu (median µs; x in a fresh order each T)\n\n", H);
    printf("| T | way | bf16 gather µs | fp32 gather µs | bf16 / fp32 | y scatter µs |\n| --- | --- | --- | --- | --- | --- |\n");
    for (size_t k = 0; k < sizeof Ts / sizeof Ts[0]; k++) {
        const size_t T = Ts[k];
        const int reps = T >= 512 ? 9 : 51;
        for (size_t i = 0; i < T; i++) b.order[i] = (int)((T - i) % T);
        const double f32 = time_us(&b, T, 1, LS_STAGE_AUTO, reps), out = time_us(&b, T, 2, LS_STAGE_AUTO, reps);
        for (int isa = LS_STAGE_AVX512; isa <= LS_STAGE_SCALAR; isa++) {
            if (!ls_stage_isa_supported((ls_stage_isa)isa)) {
                printf("| %zu | %s | not run: this CPU lacks it | | | |\n", T, isa_names[isa]);
                continue;
            }
            const double bf = time_us(&b, T, 0, (ls_stage_isa)isa, reps);
            printf("| %zu | %s | %.1f | %.1f | %.2f | %.1f |\n", T, isa_names[isa], bf, f32, bf / f32, out);
        }
    }
    free(b.x);
    free(b.y);
    free(b.staged_f32);
    free(b.staged);
    free(b.order);
    return 0;
}
