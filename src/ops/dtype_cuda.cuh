/* dtype_cuda.cuh: the storage types of the CUDA kernels, f32 and bf16, in one place: read as
 * f32 (bf16 exactly), written rounded to nearest even, and vector loads of V consecutive
 * elements; and programmatic dependent launch, both sides. Included by the op families' .cu
 * files. */
#ifndef SG_OPS_DTYPE_CUDA_CUH
#define SG_OPS_DTYPE_CUDA_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <atomic>

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

/* From f32 math to storage: bf16 rounds to nearest even, as the CPU reference's sg_st does. */
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v)
{
    return __float2bfloat16_rn(v);
}

/* From a double sum to storage, rounded once: f32 as (float)v; bf16 straight from the double
 * (going through f32 would round twice). */
template <typename T> __device__ __forceinline__ T from_d(double v);
template <> __device__ __forceinline__ float from_d<float>(double v) { return (float)v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_d<__nv_bfloat16>(double v)
{
    return __double2bfloat16(v);
}

/* V consecutive elements, loaded and stored as one access (16 bytes when V = 16/sizeof(T)). */
template <typename T, int V> struct alignas(sizeof(T) * V) vec_t {
    T e[V];
};

template <typename T, int V> __device__ __forceinline__ vec_t<T, V> ldv(const T *p, int64_t j)
{
    return reinterpret_cast<const vec_t<T, V> *>(p)[j];
}

template <typename T, int V> __device__ __forceinline__ void stv(T *p, int64_t j, vec_t<T, V> v)
{
    reinterpret_cast<vec_t<T, V> *>(p)[j] = v;
}

/* v times s rounded to f32, never contracted into an FMA: mixed precision's unscaled gradient
 * f32(g * inv), which sg_amp_unscale writes, sg_clip_sumsq_amp squares and the _amp optimizer
 * steps read, and the clipping factor's product after it. One definition for the three, so
 * that the folded passes keep the separate ones' bits (sg_amp_unscaled in amp.h is the CPU's). */
__device__ __forceinline__ float sg_times(float v, float s) { return __fmul_rn(v, s); }
__device__ __forceinline__ float4 sg_times4(float4 v, float s)
{
    return make_float4(__fmul_rn(v.x, s), __fmul_rn(v.y, s), __fmul_rn(v.z, s), __fmul_rn(v.w, s));
}

/* Programmatic dependent launch (sm_90): a kernel launched with the programmatic-serialization
 * attribute may start while the kernel before it still runs; sg_pdl_wait() blocks until that
 * kernel has completed and its writes are visible (a no-op for a kernel launched normally), so
 * everything before it may read only what no kernel still running writes. sg_pdl_trigger()
 * lets the next kernel, if launched so, start now: safe anywhere, since the next kernel's wait
 * still waits for this kernel's completion. Nothing on older architectures. */
__device__ __forceinline__ void sg_pdl_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* Asks for the 128-byte line at p to be brought into L2 (no register, no wait). */
__device__ __forceinline__ void sg_prefetch_l2(const void *p)
{
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

__device__ __forceinline__ void sg_pdl_trigger(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* The host's side: a configuration for cudaLaunchKernelEx(&l.cfg, kernel, args...) whose kernel
 * may start while the one before it on the stream still runs (the programmatic-serialization
 * attribute) when pdl (sg_ctx_pdl), and launches as <<<>>> would otherwise. cfg points at the
 * object's own attribute, so the object is neither copied nor moved. */
struct sg_pdl_launch {
    cudaLaunchAttribute attr[1];
    cudaLaunchConfig_t cfg;
    sg_pdl_launch(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl) : attr(), cfg()
    {
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = stream;
        cfg.attrs = attr, cfg.numAttrs = pdl ? 1 : 0;
    }
    sg_pdl_launch(const sg_pdl_launch &) = delete;
    sg_pdl_launch &operator=(const sg_pdl_launch &) = delete;
};

/* Dynamic shared memory past the default 48 KB must be opted into, per kernel and device. For
 * a kernel K whose size is fixed (by its template arguments), the opt-in is made once per
 * device (a bit per device 0..63 in K's own record; a later device opts in at every launch),
 * not on every eager step; allowed inside a capture. Two threads may both make the first call:
 * it is idempotent. A kernel whose size varies from call to call must opt in at each call. */
template <auto K> inline cudaError_t sg_smem_optin(size_t bytes, int device)
{
    static std::atomic<uint64_t> done{0};
    if (bytes <= 48 * 1024) return cudaSuccess;
    const uint64_t bit = device >= 0 && device < 64 ? (uint64_t)1 << device : 0;
    if (bit && (done.load(std::memory_order_acquire) & bit)) return cudaSuccess;
    const cudaError_t e = cudaFuncSetAttribute(K, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e == cudaSuccess) done.fetch_or(bit, std::memory_order_release);
    return e;
}

/* Four bf16 packed in a uint2 (element 0 in the low half) as f32: a bf16 is the top half of
 * the f32 of the same value. */
__device__ __forceinline__ float4 bf16x4_to_float4(uint2 u)
{
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u),
                       __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u));
}

/* Elements 4 i4 to 4 i4 + 3 of p as f32, one load: p aligned to 4 elements (16 bytes for f32,
 * 8 for bf16). The streaming passes over gradients (the unscale, the clipping norm, the
 * optimizer steps) read through it. */
__device__ __forceinline__ float4 sg_load4(const float *p, int64_t i4)
{
    return reinterpret_cast<const float4 *>(p)[i4];
}
__device__ __forceinline__ float4 sg_load4(const __nv_bfloat16 *p, int64_t i4)
{
    return bf16x4_to_float4(reinterpret_cast<const uint2 *>(p)[i4]);
}

#endif
