/* optim_cuda.cu: the multi-tensor optimizer kernel (AdamW, SGD with momentum), f32 parameters
 * with f32 state, or bf16 state rounded stochastically (optim.h; 8 bytes a parameter less
 * for AdamW, read and written once each): one launch
 * updates every parameter of the flat buffer, reading the hyperparameters from device memory
 * and incrementing hp.step in the same launch. Mixed precision: a device flag `skip` (nonzero:
 * the whole launch returns at entry, nothing written) and a bf16 copy of the new parameters
 * (param_lo) written in the same pass; the gradients read as f32, or as mixed precision's
 * scaled bf16 (or f32) ones times a device factor inv (sg_adamw_step_amp: the unscale done as
 * they are read, the same f32 product sg_amp_unscale writes), and then, given a second factor,
 * times the clipping factor (sg_clip_factor_sums's). Then the launchers. */
#include "ops/optim.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include "ops/dtype_cuda.cuh"

enum optim_op { OP_ADAMW, OP_SGD };

#define OPT_THREADS 256
/* float4s a thread handles per loop trip, by state dtype: two with bf16 state (its bytes in
 * flight a thread, 40 with one float4, were what held it: session 43, 490.7 us against 504.6),
 * one with f32 (whose kernel spills at 64 registers with two, 639 us against 615). */
template <typename S> constexpr int opt_vecs() { return sizeof(S) == 2 ? 2 : 1; }
/* elements a block handles per loop trip */
template <typename S> constexpr int64_t opt_chunk() { return (int64_t)OPT_THREADS * 4 * opt_vecs<S>(); }
#define OPT_BLOCKS_PER_SM 4

/* Per-launch scalars, derived once per thread from hp (8 floats, broadcast loads). */
struct hyper {
    float lr, b1, b2, eps, wd, momentum, dampening, step;
    uint32_t t;       /* step + 1, the stochastic rounding's counter word */
    float decay_mul;  /* AdamW: 1 - lr*wd */
    float step_size;  /* AdamW: lr / (1 - b1^t) */
    float bc2_sqrt;   /* AdamW: sqrt(1 - b2^t) */
    bool first;       /* SGD: t == 1, the momentum buffer starts as g */
};

/* hp is not const/__restrict__: the last block writes hp.step in this launch. */
__device__ __forceinline__ hyper read_hyper(const float *hp)
{
    hyper h;
    h.lr = hp[SG_HP_LR];
    h.b1 = hp[SG_HP_BETA1];
    h.b2 = hp[SG_HP_BETA2];
    h.eps = hp[SG_HP_EPS];
    h.wd = hp[SG_HP_WEIGHT_DECAY];
    h.momentum = hp[SG_HP_MOMENTUM];
    h.dampening = hp[SG_HP_DAMPENING];
    h.step = hp[SG_HP_STEP];
    float t = h.step + 1.f;
    h.t = (uint32_t)t;
    /* fp32 bias corrections, as PyTorch's capturable/fused paths compute them. */
    h.decay_mul = 1.f - h.lr * h.wd;
    h.step_size = h.lr / (1.f - powf(h.b1, t));
    h.bc2_sqrt = sqrtf(1.f - powf(h.b2, t));
    h.first = t == 1.f;
    return h;
}

/* One element. AdamW: m, v are the moments; SGD: m is the momentum buffer, v unused. Every
 * operation is spelled out as an intrinsic (rounded as written, nothing contracted by the
 * compiler): otherwise nvcc picks which product of a + b*c + d*e to fuse into an fma per
 * instantiation, and the kernel that reads f32 gradients and the one that unscales bf16 ones
 * (sg_adamw_step_amp), or the f32-state and bf16-state ones, would round differently. */
template <int OP>
__device__ __forceinline__ void update(const hyper &h, bool decay, float &p, float g, float &m,
                                       float &v)
{
    if (OP == OP_ADAMW) {
        if (decay) p = __fmul_rn(p, h.decay_mul);
        m = __fmaf_rn(h.b1, m, __fmul_rn(1.f - h.b1, g));
        v = __fmaf_rn(h.b2, v, __fmul_rn(__fmul_rn(1.f - h.b2, g), g));
        const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), h.bc2_sqrt), h.eps);
        p = __fsub_rn(p, __fdiv_rn(__fmul_rn(h.step_size, m), denom));
    } else {
        if (decay) g = __fmaf_rn(h.wd, p, g);
        if (h.momentum != 0.f) {
            m = h.first ? g : __fmaf_rn(h.momentum, m, __fmul_rn(1.f - h.dampening, g));
            g = m;
        }
        p = __fsub_rn(p, __fmul_rn(h.lr, g));
    }
}

/* The last segment s in [lo, hi] with seg_start[s] <= i. Stays in [lo, hi] whatever the table
 * holds (CUDA does not check its contents), so a bad table gives wrong flags, never a fault. */
__device__ __forceinline__ int seg_find(const int *__restrict__ seg_start, int lo, int hi, int64_t i)
{
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (seg_start[mid] <= i) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* seg_find over [lo, last] for an i at or past seg_start[lo] (the chunks a block visits go
 * up, and so does the segment each starts in): one load when i is still in lo's segment, the
 * binary search past it otherwise. The same answer as a search from 0 for a sorted table; for
 * any other, still a segment in [lo, last]. */
__device__ __forceinline__ int seg_from(const int *__restrict__ seg_start, int lo, int last, int64_t i)
{
    if (lo >= last || seg_start[lo + 1] > i) return lo;
    return seg_find(seg_start, lo + 1, last, i);
}

/* Whether the momentum buffer (SGD) / the moments (AdamW) are touched at all. */
template <int OP> __device__ __forceinline__ bool uses_m(const hyper &h)
{
    return OP == OP_ADAMW || h.momentum != 0.f;
}

/* State storage: f32, or bf16 rounded stochastically (optim.h) with r, 16 random bits. */
__device__ __forceinline__ float ld_state(const float *s, int64_t i) { return s[i]; }
__device__ __forceinline__ float ld_state(const __nv_bfloat16 *s, int64_t i) { return __bfloat162float(s[i]); }
__device__ __forceinline__ void st_state(float *s, int64_t i, float x, uint32_t) { s[i] = x; }
__device__ __forceinline__ void st_state(__nv_bfloat16 *s, int64_t i, float x, uint32_t r)
{
    reinterpret_cast<unsigned short *>(s)[i] = sg_bf16_round_stochastic(x, r);
}
__device__ __forceinline__ float4 ld_state4(const float *s, int64_t i4)
{
    return reinterpret_cast<const float4 *>(s)[i4];
}
__device__ __forceinline__ float4 ld_state4(const __nv_bfloat16 *s, int64_t i4)
{
    return bf16x4_to_float4(reinterpret_cast<const uint2 *>(s)[i4]);
}
/* r[k] >> shift: element k's 16 bits (shift 0: m or buf; 16: v). */
__device__ __forceinline__ void st_state4(float *s, int64_t i4, float4 x, const uint32_t *, int)
{
    reinterpret_cast<float4 *>(s)[i4] = x;
}
__device__ __forceinline__ void st_state4(__nv_bfloat16 *s, int64_t i4, float4 x, const uint32_t *r, int shift)
{
    uint32_t a = sg_bf16_round_stochastic(x.x, r[0] >> shift), b = sg_bf16_round_stochastic(x.y, r[1] >> shift);
    uint32_t c = sg_bf16_round_stochastic(x.z, r[2] >> shift), d = sg_bf16_round_stochastic(x.w, r[3] >> shift);
    reinterpret_cast<uint2 *>(s)[i4] = make_uint2(a | (b << 16), c | (d << 16));
}
template <typename S> __device__ __forceinline__ bool sr() { return sizeof(S) == 2; }

/* Gradient loads: f32 as stored, or times inv and then times fac, each product rounded (the
 * scaled gradients of mixed precision, unscaled and then clipped; fac is 1 without clipping,
 * and x * 1 is x). */
template <bool SCALED, typename G> __device__ __forceinline__ float ld_grad(const G *g, int64_t i, float inv, float fac)
{
    return SCALED ? sg_times(sg_times(to_f(g[i]), inv), fac) : to_f(g[i]);
}
template <bool SCALED, typename G>
__device__ __forceinline__ float4 ld_grad4(const G *g, int64_t i4, float inv, float fac)
{
    const float4 r = sg_load4(g, i4);
    return SCALED ? sg_times4(sg_times4(r, inv), fac) : r;
}

template <int OP, typename S, bool SCALED, typename G>
__device__ __forceinline__ void update_one(const hyper &h, bool decay, float *p, const G *g, float inv,
                                           float fac, S *m, S *v, __nv_bfloat16 *plo, int64_t i)
{
    float pi = p[i], mi = uses_m<OP>(h) ? ld_state(m, i) : 0.f, vi = OP == OP_ADAMW ? ld_state(v, i) : 0.f;
    update<OP>(h, decay, pi, ld_grad<SCALED>(g, i, inv, fac), mi, vi);
    p[i] = pi;
    if (plo) plo[i] = __float2bfloat16_rn(pi);
    uint32_t w = sr<S>() ? sg_optim_sr_bits((uint64_t)i / 4, h.t).v[i % 4] : 0u;
    if (uses_m<OP>(h)) st_state(m, i, mi, w & 0xffffu);
    if (OP == OP_ADAMW) st_state(v, i, vi, w >> 16);
}

/* Two floats rounded to bf16 (nearest even) and packed, the first in the low half. */
__device__ __forceinline__ unsigned pack_bf16x2(float a, float b)
{
    return (unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(a)) |
           ((unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(b)) << 16);
}

/* param/grad/m/v (n), cut into n_seg segments by seg_start (n_seg+1); seg_decay (n_seg);
 * SCALED: grad is G (bf16 or f32) times inv_p[0], then times inv_p[1] when n_inv is 2 (the
 * clipping factor), else f32 as stored;
 * plo (n) bf16 or NULL: bf16(param) after the update; skip (1) or NULL: when nonzero every
 * thread returns before reading anything else, so nothing is written, hp.step and the block
 * counter included (every block sees the same flag: nothing in this launch writes it).
 * Blocks stride over chunks of OPT_CHUNK elements. A chunk's segment range [lo, hi] is found
 * once (the same binary search in every thread: broadcast loads); an element's segment is then
 * searched within it, which is no work at all when the chunk lies inside one tensor.
 * vec: all f32 buffers 16-byte aligned (plo 8-byte), so the float4 at chunk + 4*tid is too
 * (chunks are multiples of 4 elements); otherwise elements go one by one, coalesced.
 * Every thread reads the old hp.step at entry; each block then counts itself done in *done
 * and the last one writes step + 1. atomicInc wraps the counter back to 0 on the last block,
 * so the next launch (or graph replay) finds it at 0. */
template <int OP, typename S, bool SCALED, typename G>
__global__ void __launch_bounds__(OPT_THREADS, sizeof(S) == 2 ? OPT_BLOCKS_PER_SM : 0)
optim_kernel(float *__restrict__ p, const G *__restrict__ g, const float *__restrict__ inv_p, int n_inv,
             S *__restrict__ m, S *__restrict__ v, float *hp, const int *__restrict__ seg_start,
             const int *__restrict__ seg_decay, int n_seg, int64_t n, bool vec,
             const int *__restrict__ skip, __nv_bfloat16 *__restrict__ plo, unsigned int *done)
{
    if (skip && *skip != 0) return;
    const hyper h = read_hyper(hp);
    const float inv = SCALED ? inv_p[0] : 1.f, fac = SCALED && n_inv > 1 ? inv_p[1] : 1.f;
    constexpr int OPT_VECS = opt_vecs<S>();
    constexpr int64_t OPT_CHUNK = opt_chunk<S>();
    int lo = 0; /* the segment the previous chunk started in */
    for (int64_t base = blockIdx.x * (int64_t)OPT_CHUNK; base < n;
         base += (int64_t)gridDim.x * OPT_CHUNK) {
        int64_t end = base + OPT_CHUNK < n ? base + OPT_CHUNK : n;
        /* Both float4s' loads go out before the segment lookup, so that its loads of the table
         * wait beside them instead of ahead of them. */
        int64_t i[OPT_VECS];
        bool whole[OPT_VECS];
        float4 p4[OPT_VECS], g4[OPT_VECS], m4[OPT_VECS], v4[OPT_VECS];
#pragma unroll
        for (int u = 0; u < OPT_VECS; u++) {
            i[u] = base + u * (4 * OPT_THREADS) + 4 * (int64_t)threadIdx.x;
            whole[u] = vec && i[u] + 4 <= end;
            if (whole[u]) {
                p4[u] = reinterpret_cast<const float4 *>(p)[i[u] / 4];
                g4[u] = ld_grad4<SCALED>(g, i[u] / 4, inv, fac);
                m4[u] = uses_m<OP>(h) ? ld_state4(m, i[u] / 4) : g4[u];
                v4[u] = OP == OP_ADAMW ? ld_state4(v, i[u] / 4) : g4[u];
            }
        }
        lo = seg_from(seg_start, lo, n_seg - 1, base);
        const int hi = seg_from(seg_start, lo, n_seg - 1, end - 1);
        if (vec) {
#pragma unroll
            for (int u = 0; u < OPT_VECS; u++) {
                if (whole[u]) {
                    /* A float4 may straddle segments: walk s forward per element. */
                    int s = seg_find(seg_start, lo, hi, i[u]);
                    bool d[4];
                    for (int k = 0; k < 4; k++) {
                        while (s < hi && seg_start[s + 1] <= i[u] + k) s++;
                        d[k] = seg_decay[s] != 0;
                    }
                    update<OP>(h, d[0], p4[u].x, g4[u].x, m4[u].x, v4[u].x);
                    update<OP>(h, d[1], p4[u].y, g4[u].y, m4[u].y, v4[u].y);
                    update<OP>(h, d[2], p4[u].z, g4[u].z, m4[u].z, v4[u].z);
                    update<OP>(h, d[3], p4[u].w, g4[u].w, m4[u].w, v4[u].w);
                    reinterpret_cast<float4 *>(p)[i[u] / 4] = p4[u];
                    if (plo)
                        reinterpret_cast<uint2 *>(plo)[i[u] / 4] =
                            make_uint2(pack_bf16x2(p4[u].x, p4[u].y), pack_bf16x2(p4[u].z, p4[u].w));
                    uint32_t r[4] = {0, 0, 0, 0};
                    if (sr<S>()) {
                        sg_philox_out w = sg_optim_sr_bits((uint64_t)i[u] / 4, h.t);
                        r[0] = w.v[0], r[1] = w.v[1], r[2] = w.v[2], r[3] = w.v[3];
                    }
                    if (uses_m<OP>(h)) st_state4(m, i[u] / 4, m4[u], r, 0);
                    if (OP == OP_ADAMW) st_state4(v, i[u] / 4, v4[u], r, 16);
                } else {
                    for (int64_t j = i[u]; j < end; j++) /* the buffer's last 1-3 elements */
                        update_one<OP, S, SCALED>(h, seg_decay[seg_find(seg_start, lo, hi, j)] != 0, p, g, inv,
                                                  fac, m, v, plo, j);
                }
            }
        } else {
            for (int k = 0; k < 4 * OPT_VECS; k++) {
                int64_t j = base + k * OPT_THREADS + threadIdx.x;
                if (j < end)
                    update_one<OP, S, SCALED>(h, seg_decay[seg_find(seg_start, lo, hi, j)] != 0, p, g, inv, fac,
                                              m, v, plo, j);
            }
        }
    }
    /* All of this block's threads have read hp (and finished) before thread 0 counts it done. */
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicInc(done, gridDim.x - 1) == gridDim.x - 1) hp[SG_HP_STEP] = h.step + 1.f;
    }
}

static bool aligned16(const void *q) { return ((uintptr_t)q & 15u) == 0; }
static bool aligned8(const void *q) { return ((uintptr_t)q & 7u) == 0; } /* 4 bf16 */

/* The kernel for state S and gradients (G, SCALED); one launch. */
template <int OP, typename S, bool SCALED, typename G>
static void launch_kernel(int blocks, cudaStream_t st, float *p, const void *g, const float *inv, int n_inv, void *m,
                          void *v, float *hp, const int *ss, const int *sd, int n_seg, int64_t n, bool vec, const int *sk,
                          __nv_bfloat16 *lo, unsigned int *done)
{
    optim_kernel<OP, S, SCALED, G><<<blocks, OPT_THREADS, 0, st>>>(p, (const G *)g, inv, n_inv, (S *)m, (S *)v, hp,
                                                                   ss, sd, n_seg, n, vec, sk, lo, done);
}

/* The state dtype's kernel for the gradients: f32 as stored, or scaled (inv: 1 or 2 factors)
 * bf16 or f32. */
template <int OP, typename S>
static void launch_state(const sg_tensor *grad, const sg_tensor *inv, int blocks, cudaStream_t st, float *p, void *m,
                         void *v, float *hp, const int *ss, const int *sd, int n_seg, int64_t n, bool vec,
                         const int *sk, __nv_bfloat16 *lo, unsigned int *done)
{
    const float *ip = inv ? (const float *)inv->data : nullptr;
    const int ni = inv ? (int)inv->numel : 0;
    if (!inv)
        launch_kernel<OP, S, false, float>(blocks, st, p, grad->data, ip, ni, m, v, hp, ss, sd, n_seg, n, vec, sk, lo,
                                           done);
    else if (grad->dtype == SG_DTYPE_BF16)
        launch_kernel<OP, S, true, __nv_bfloat16>(blocks, st, p, grad->data, ip, ni, m, v, hp, ss, sd, n_seg, n, vec,
                                                  sk, lo, done);
    else
        launch_kernel<OP, S, true, float>(blocks, st, p, grad->data, ip, ni, m, v, hp, ss, sd, n_seg, n, vec, sk, lo,
                                          done);
}

template <int OP>
static sg_status launch(sg_ctx *ctx, sg_tensor *param, const sg_tensor *grad, const sg_tensor *inv, sg_tensor *m,
                        sg_tensor *v, sg_tensor *hp, const sg_tensor *seg_start,
                        const sg_tensor *seg_decay, int n_seg, const sg_tensor *skip,
                        sg_tensor *param_lo)
{
    void *done = NULL;
    SG_TRY(sg_ctx_scratch(ctx, SG_SLOT_OPTIM, SG_OPTIM_SCRATCH_BYTES, &done));
    int64_t n = param->numel;
    const bool lo_state = m->dtype == SG_DTYPE_BF16; /* v has m's dtype (optim.c) */
    const int64_t chunk = lo_state ? opt_chunk<__nv_bfloat16>() : opt_chunk<float>();
    int64_t want = (n + chunk - 1) / chunk;
    /* One wave: the AdamW kernel takes 52 to 58 registers (nvcc 13.0, by state dtype), so 4
     * blocks of 256 fit an SM, with 64 KiB of f32 loads in flight (session 42: 6 blocks, where
     * fewer registers let them fit, gained nothing). */
    int64_t cap = (int64_t)sg_ctx_sm_count(ctx) * OPT_BLOCKS_PER_SM;
    if (cap < 1) cap = 1;
    int blocks = (int)(want < 1 ? 1 : (want < cap ? want : cap));
    bool (*state_aligned)(const void *) = lo_state ? aligned8 : aligned16;
    bool (*grad_aligned)(const void *) = grad->dtype == SG_DTYPE_BF16 ? aligned8 : aligned16;
    bool vec = aligned16(param->data) && grad_aligned(grad->data) && state_aligned(m->data) &&
               (!v || state_aligned(v->data)) && (!param_lo || aligned8(param_lo->data));
    cudaStream_t st = (cudaStream_t)sg_ctx_stream(ctx);
    float *pp = (float *)param->data, *hpp = (float *)hp->data;
    const int *ss = (const int *)seg_start->data, *sd = (const int *)seg_decay->data;
    const int *sk = skip ? (const int *)skip->data : nullptr;
    __nv_bfloat16 *lo = param_lo ? (__nv_bfloat16 *)param_lo->data : nullptr;
    void *vp = v ? v->data : nullptr;
    if (lo_state)
        launch_state<OP, __nv_bfloat16>(grad, inv, blocks, st, pp, m->data, vp, hpp, ss, sd, n_seg, n, vec, sk, lo,
                                        (unsigned int *)done);
    else
        launch_state<OP, float>(grad, inv, blocks, st, pp, m->data, vp, hpp, ss, sd, n_seg, n, vec, sk, lo,
                                (unsigned int *)done);
    SG_CUDA_CHECK_LAUNCH(ctx, "optim_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

extern "C" sg_status sg_adamw_step_cuda(sg_ctx *ctx, sg_tensor *param, const sg_tensor *grad, const sg_tensor *inv,
                                        sg_tensor *m, sg_tensor *v, sg_tensor *hp,
                                        const sg_tensor *seg_start, const sg_tensor *seg_decay,
                                        int n_seg, const sg_tensor *skip, sg_tensor *param_lo)
{
    return launch<OP_ADAMW>(ctx, param, grad, inv, m, v, hp, seg_start, seg_decay, n_seg, skip,
                            param_lo);
}

extern "C" sg_status sg_sgd_step_cuda(sg_ctx *ctx, sg_tensor *param, const sg_tensor *grad, const sg_tensor *inv,
                                      sg_tensor *buf, sg_tensor *hp, const sg_tensor *seg_start,
                                      const sg_tensor *seg_decay, int n_seg,
                                      const sg_tensor *skip, sg_tensor *param_lo)
{
    return launch<OP_SGD>(ctx, param, grad, inv, buf, nullptr, hp, seg_start, seg_decay, n_seg, skip,
                          param_lo);
}
