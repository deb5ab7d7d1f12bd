/* The CPU engine's element-wise steps. One scalar routine for every ISA
 * path, built for the baseline x86-64 with contraction off, so SiLU and
 * the gate give the same bits whichever tiles ran the GEMMs. */
#ifndef LS_GPU_CPU_ELTWISE_H
#define LS_GPU_CPU_ELTWISE_H

/* e^x from a fixed sequence of IEEE operations (no libm: its result may
 * differ between C libraries and their CPU-specific variants). Within 2
 * ulp where e^x is a normal float, rounded once where it is subnormal,
 * inf past ln(FLT_MAX) and 0 below -104, as float's e^x; NaN gives NaN. */
float ls_cpu_expf(float x);

/* a[j] = (gamma * silu(g[j])) * u[j] for j < count, silu(v) = v / (1 + e^-v),
 * or v * e^v for v < -88 (where 1 + e^-v overflows). */
void ls_cpu_swiglu(const float *g, const float *u, float gamma, float *a, int count);

/* v[i] = 1 / (1 + e^-v[i]) for i < count (e^v[i] for v[i] < -88): the
 * shared-expert gate. */
void ls_cpu_sigmoid(float *v, int count);

#endif
