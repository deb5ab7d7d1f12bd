/* Device-side conversions between the storage dtypes (fp32, bf16, f16)
 * and fp32, shared by the kernels of gpu/cuda. Rounding to 16 bits is
 * round-to-nearest-even, as the host's ls_f32_to_bf16. */
#ifndef LS_GPU_CUDA_DTYPE_CUH
#define LS_GPU_CUDA_DTYPE_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

template <typename T> __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> __device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }

template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }

/* The values of one 16-byte run of T (16 / sizeof(T) of them) as fp32. */
template <typename T> __device__ __forceinline__ void unpack16(uint4 raw, float *out);
template <> __device__ __forceinline__ void unpack16<float>(uint4 raw, float *out) {
    out[0] = __uint_as_float(raw.x);
    out[1] = __uint_as_float(raw.y);
    out[2] = __uint_as_float(raw.z);
    out[3] = __uint_as_float(raw.w);
}
/* A bf16 is the top half of the fp32 with the same bits; the lower
 * address (the low half of a word) holds the first element. */
template <> __device__ __forceinline__ void unpack16<__nv_bfloat16>(uint4 raw, float *out) {
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        out[2 * i] = __uint_as_float(w[i] << 16);
        out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}
template <> __device__ __forceinline__ void unpack16<__half>(uint4 raw, float *out) {
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        out[2 * i] = __half2float(__ushort_as_half((unsigned short)(w[i] & 0xffffu)));
        out[2 * i + 1] = __half2float(__ushort_as_half((unsigned short)(w[i] >> 16)));
    }
}

#endif
