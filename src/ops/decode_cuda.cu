/* decode_cuda.cu: kernels of the decode ops (decode.h) and their launchers. Storage f32 or bf16,
 * math in f32. Every sum runs in a fixed order for a given shape (no float atomics), so a
 * decode step gives the same bits eagerly, captured and looped.
 *
 * kv_attention: one block of KV_THREADS per (row, head). The block stores the row's k and v in
 * the cache and loads q; each thread scores whole keys (16-byte loads), so a decode step's
 * few hundred keys are read at once rather than walked, and keeps a running (max, sum of exp)
 * over its keys; one block merge of those pairs gives the softmax's max and sum. The weighted
 * sum: the threads form G groups of the head's hs/V column vectors, group g takes keys g, g + G,
 * ... (16-byte loads, four keys' in flight), and the groups' sums are added in group order. A
 * first version walked the keys one warp-round-trip at a time: 80 us a layer at 200 positions,
 * 1 ms a token for gpt-768-12.
 *
 * gen_sample: one block per sequence. The argmax is a block reduction (larger logit, then lower
 * index). Top-k's threshold is found bit by bit over the logits' ordered keys, 32 block counts.
 * The sampled token: each thread sums the weights of a contiguous chunk in index order, thread
 * 0 lays the chunks' running sums end to end, and the thread whose chunk holds u * sum walks it.
 * The state is updated by thread 0; the last block to finish (a ticket counter in ctl) sets GO
 * from every sequence's DONE and resets the counter. */
#include "ops/decode.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include "ops/dtype_cuda.cuh"

#define KV_THREADS 256
#define KV_WARPS (KV_THREADS / 32)
#include <stdint.h>
#define GEN_THREADS 256
#define FULL_MASK 0xffffffffu

static cudaStream_t stream_of(sg_ctx *ctx) { return (cudaStream_t)sg_ctx_stream(ctx); }

/* ---- block reductions (every thread gets the result; sh: blockDim/32 slots) ---- */

struct max_op {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct add_op {
    template <typename T> __device__ T operator()(T a, T b) const { return a + b; }
};

/* A warp butterfly, then warp 0's order over the warps' results: the same value, bit for bit,
 * in every thread and on every run. */
template <typename T, typename Op> __device__ __forceinline__ T block_reduce(T v, T *sh, Op op)
{
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(FULL_MASK, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    T r = sh[0];
    for (int k = 1; k < (int)(blockDim.x >> 5); k++) r = op(r, sh[k]);
    return r;
}

/* ---- cache attention ---- */

/* Online softmax: (m, l) = the running max and sum of exp(score - m); merge in (mb, lb). */
__device__ __forceinline__ void softmax_merge(float &m, float &l, float mb, float lb)
{
    if (mb == -INFINITY) return;
    if (m == -INFINITY) {
        m = mb, l = lb;
        return;
    }
    const float M = fmaxf(m, mb);
    l = l * __expf(m - M) + lb * __expf(mb - M);
    m = M;
}

/* Every thread's (m, l) merged over the block: a warp butterfly, then the warps' in order. sh:
 * 2 * KV_WARPS floats. */
__device__ __forceinline__ void block_softmax(float &m, float &l, float *sh)
{
    for (int o = 16; o > 0; o >>= 1)
        softmax_merge(m, l, __shfl_xor_sync(FULL_MASK, m, o), __shfl_xor_sync(FULL_MASK, l, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh[2 * (threadIdx.x >> 5)] = m, sh[2 * (threadIdx.x >> 5) + 1] = l;
    __syncthreads();
    m = sh[0], l = sh[1];
    for (int k = 1; k < KV_WARPS; k++) softmax_merge(m, l, sh[2 * k], sh[2 * k + 1]);
}

/* Key (or value) t of head h of sequence b: from the cache below the first new row s0, else
 * from the new rows in qkv (off: C for k, 2C for v). */
template <typename T>
__device__ __forceinline__ const T *kv_row(const T *cache, size_t cb, const T *qkv, int t, int s0, int b, int Tq,
                                           int C, int h, int hs, int off)
{
    return t < s0 ? cache + cb + (size_t)t * hs : qkv + (size_t)(b * Tq + t - s0) * 3 * C + off + (size_t)h * hs;
}

/* qkv (B*Tq, 3C), out (B*Tq, C), caches (Bc, H, Tc, hs); grid (B*Tq, H). Shared: q (hs), scores
 * (Tc), the warps' partial outputs (KV_WARPS * hs). V: elements a key load takes (16 bytes when
 * the rows allow it, else 1). The scores: one thread per key, all keys in flight at once (a
 * decode step's keys are few, and a warp walking them one by one waited on memory each time).
 * The weighted sum: warp w takes keys w, w + KV_WARPS, ..., its lanes the head's columns, four
 * keys' loads in flight; the warps' sums are added in warp order. Launched with programmatic
 * dependent launch (sm_90): before it waits for the kernels before it, it reads start and asks L2
 * for the cached rows below start (decode.h says why that is safe). */
template <typename T, int V>
__global__ void __launch_bounds__(KV_THREADS)
    kv_attention_kernel(const T *qkv, const int32_t *start, T *kc, T *vc, T *out, int Tq, int C, int H, int hs,
                        int Tc, float scale)
{
    extern __shared__ float sm[];
    float *q = sm, *s = sm + hs, *red = s + Tc;
    const int row = blockIdx.x, h = blockIdx.y, b = row / Tq, i = row % Tq, tid = threadIdx.x;
    sg_pdl_trigger();
    const int s0 = start[b], p = s0 + i;
    const size_t cb = (size_t)(b * H + h) * Tc * hs;
    if (p >= 0 && p < Tc) { /* the cached rows below start, into L2, while the kernel before runs */
        const size_t bytes = (size_t)s0 * hs * sizeof(T);
        for (size_t off = (size_t)tid * 128; off < bytes; off += (size_t)KV_THREADS * 128) {
            sg_prefetch_l2(reinterpret_cast<const char *>(kc + cb) + off);
            sg_prefetch_l2(reinterpret_cast<const char *>(vc + cb) + off);
        }
    }
    sg_pdl_wait();
    const T *qr = qkv + (size_t)row * 3 * C + (size_t)h * hs;
    T *o = out + (size_t)row * C + (size_t)h * hs;
    if (p < 0 || p >= Tc) {
        for (int d = tid; d < hs; d += KV_THREADS) o[d] = from_f<T>(0.f);
        return;
    }
    for (int d = tid; d < hs; d += KV_THREADS) {
        kc[cb + (size_t)p * hs + d] = qr[C + d];
        vc[cb + (size_t)p * hs + d] = qr[2 * C + d];
        q[d] = to_f(qr[d]);
    }
    __syncthreads();
    /* Scores, one key a thread, and this thread's running (max, sum of exp) over its keys. */
    float m = -INFINITY, l = 0.f;
    for (int t = tid; t <= p; t += KV_THREADS) {
        const T *kt = kv_row(kc, cb, qkv, t, s0, b, Tq, C, h, hs, C);
        float acc = 0.f;
#pragma unroll 8
        for (int j = 0; j < hs / V; j++) {
            vec_t<T, V> kv = ldv<T, V>(kt, j);
#pragma unroll
            for (int e = 0; e < V; e++) acc += q[j * V + e] * to_f(kv.e[e]);
        }
        const float sc = s[t] = acc * scale;
        softmax_merge(m, l, sc, 1.f);
    }
    block_softmax(m, l, red);
    /* The weighted sum: thread (g, c) takes column vector c of keys g, g + G, ...; the G groups'
     * sums are added in group order. */
    const int ncv = hs / V, G = KV_THREADS / ncv, g = tid / ncv, c = tid % ncv;
    __syncthreads(); /* red is free again */
    if (g < G) {
        float acc[V];
#pragma unroll
        for (int e = 0; e < V; e++) acc[e] = 0.f;
#pragma unroll 4
        for (int t = g; t <= p; t += G) {
            const float wt = __expf(s[t] - m);
            vec_t<T, V> vv = ldv<T, V>(kv_row(vc, cb, qkv, t, s0, b, Tq, C, h, hs, 2 * C), c);
#pragma unroll
            for (int e = 0; e < V; e++) acc[e] += wt * to_f(vv.e[e]);
        }
#pragma unroll
        for (int e = 0; e < V; e++) red[g * hs + c * V + e] = acc[e];
    }
    __syncthreads();
    for (int d = tid; d < hs; d += KV_THREADS) {
        float r = 0.f;
        for (int k = 0; k < G; k++) r += red[k * hs + d];
        o[d] = from_f<T>(r / l);
    }
}

template <typename T, int V>
static sg_status kv_attention_v(sg_ctx *ctx, const sg_tensor *qkv, int heads, const sg_tensor *start, sg_tensor *kc,
                                sg_tensor *vc, sg_tensor *out)
{
    const int B = (int)start->numel, rows = (int)qkv->shape[0], C = (int)out->shape[1], hs = C / heads;
    const int Tc = (int)kc->shape[2];
    /* q, the scores, and the key groups' partial sums (or the block's (max, sum) pairs) */
    const int groups = KV_THREADS / (hs / V);
    const size_t smem = (size_t)(hs + Tc + (groups * hs > 2 * KV_WARPS ? groups * hs : 2 * KV_WARPS)) * sizeof(float);
    if (smem > 48 * 1024)
        SG_CUDA_CHECK(ctx, cudaFuncSetAttribute(kv_attention_kernel<T, V>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                (int)smem));
    const sg_pdl_launch l(dim3((unsigned)rows, (unsigned)heads), dim3(KV_THREADS), smem, stream_of(ctx),
                          sg_ctx_pdl(ctx));
    SG_CUDA_CHECK(ctx, cudaLaunchKernelEx(&l.cfg, kv_attention_kernel<T, V>, (const T *)qkv->data,
                                          (const int32_t *)start->data, (T *)kc->data, (T *)vc->data, (T *)out->data,
                                          rows / B, C, heads, hs, Tc, 1.f / sqrtf((float)hs)));
    SG_CUDA_CHECK_LAUNCH(ctx, "kv_attention_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

/* 16-byte key loads when every key row starts 16-byte aligned: the cache's (hs a multiple of
 * V) and qkv's (C too, and the base pointers). */
template <typename T>
static sg_status kv_attention_t(sg_ctx *ctx, const sg_tensor *qkv, int heads, const sg_tensor *start,
                                sg_tensor *kc, sg_tensor *vc, sg_tensor *out)
{
    const int V = 16 / (int)sizeof(T), C = (int)out->shape[1], hs = C / heads;
    const bool vec = hs % V == 0 && C % V == 0 && ((uintptr_t)qkv->data % 16) == 0 && ((uintptr_t)kc->data % 16) == 0;
    if (vec) return kv_attention_v<T, 16 / sizeof(T)>(ctx, qkv, heads, start, kc, vc, out);
    return kv_attention_v<T, 1>(ctx, qkv, heads, start, kc, vc, out);
}

extern "C" sg_status sg_kv_attention_cuda(sg_ctx *ctx, const sg_tensor *qkv, int heads, const sg_tensor *start,
                                          sg_tensor *kcache, sg_tensor *vcache, sg_tensor *out)
{
    if (qkv->dtype == SG_DTYPE_BF16) return kv_attention_t<__nv_bfloat16>(ctx, qkv, heads, start, kcache, vcache, out);
    if (qkv->dtype == SG_DTYPE_F32) return kv_attention_t<float>(ctx, qkv, heads, start, kcache, vcache, out);
    return sg_fail(ctx, SG_ERR_DTYPE, "sg_kv_attention: 'qkv' is %s; the CUDA kernel takes f32 or bf16",
                   sg_dtype_name(qkv->dtype));
}

/* ---- positioned embedding, last rows ---- */

template <typename T>
__global__ void embed_at_kernel(const int32_t *tok, const int32_t *pos, const T *wte, const T *wpe, T *y, int C,
                                int V, int Tmax)
{
    sg_pdl_trigger();
    const int b = blockIdx.x, t = tok[b], p = pos[b];
    const bool ok = t >= 0 && t < V && p >= 0 && p < Tmax;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        y[(size_t)b * C + c] = ok ? from_f<T>(to_f(wte[(size_t)t * C + c]) + to_f(wpe[(size_t)p * C + c])) : from_f<T>(0.f);
}

template <typename T>
__global__ void last_rows_kernel(const T *x, const int32_t *info, T *y, int C, int Tp)
{
    const int b = blockIdx.x, n = info[b * SG_GEN_INFO + SG_GEN_PLEN];
    const bool ok = n >= 1 && n <= Tp;
    const T *xr = x + ((size_t)b * Tp + (ok ? n - 1 : 0)) * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) y[(size_t)b * C + c] = ok ? xr[c] : from_f<T>(0.f);
}

extern "C" sg_status sg_embed_at_cuda(sg_ctx *ctx, const sg_tensor *tok, const sg_tensor *pos, const sg_tensor *wte,
                                      const sg_tensor *wpe, sg_tensor *y)
{
    const int B = (int)tok->numel, C = (int)y->shape[1], V = (int)wte->shape[0], Tm = (int)wpe->shape[0];
    const int threads = C < 256 ? 128 : 256;
    if (wte->dtype == SG_DTYPE_BF16)
        embed_at_kernel<__nv_bfloat16><<<B, threads, 0, stream_of(ctx)>>>(
            (const int32_t *)tok->data, (const int32_t *)pos->data, (const __nv_bfloat16 *)wte->data,
            (const __nv_bfloat16 *)wpe->data, (__nv_bfloat16 *)y->data, C, V, Tm);
    else if (wte->dtype == SG_DTYPE_F32)
        embed_at_kernel<float><<<B, threads, 0, stream_of(ctx)>>>((const int32_t *)tok->data, (const int32_t *)pos->data,
                                                                  (const float *)wte->data, (const float *)wpe->data,
                                                                  (float *)y->data, C, V, Tm);
    else
        return sg_fail(ctx, SG_ERR_DTYPE, "sg_embed_at: 'wte' is %s; the CUDA kernel takes f32 or bf16",
                       sg_dtype_name(wte->dtype));
    SG_CUDA_CHECK_LAUNCH(ctx, "embed_at_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

extern "C" sg_status sg_gen_last_rows_cuda(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *info, sg_tensor *y)
{
    const int B = (int)y->shape[0], C = (int)y->shape[1], Tp = (int)(x->shape[0] / B);
    const int threads = C < 256 ? 128 : 256;
    if (y->dtype == SG_DTYPE_BF16)
        last_rows_kernel<__nv_bfloat16><<<B, threads, 0, stream_of(ctx)>>>(
            (const __nv_bfloat16 *)x->data, (const int32_t *)info->data, (__nv_bfloat16 *)y->data, C, Tp);
    else if (y->dtype == SG_DTYPE_F32)
        last_rows_kernel<float><<<B, threads, 0, stream_of(ctx)>>>((const float *)x->data,
                                                                   (const int32_t *)info->data, (float *)y->data, C, Tp);
    else
        return sg_fail(ctx, SG_ERR_DTYPE, "sg_gen_last_rows: 'y' is %s; the CUDA kernel takes f32 or bf16",
                       sg_dtype_name(y->dtype));
    SG_CUDA_CHECK_LAUNCH(ctx, "last_rows_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

/* ---- the state ---- */

__global__ void gen_begin_kernel(int32_t *tok, int32_t *pos, int32_t *info, int B, int32_t *ctl)
{
    for (int b = threadIdx.x; b < B; b += blockDim.x) {
        int32_t *r = info + b * SG_GEN_INFO;
        tok[b] = 0;
        pos[b] = r[SG_GEN_PLEN] - 1;
        r[SG_GEN_LEN] = 0;
        r[SG_GEN_DONE] = r[SG_GEN_MAXNEW] <= 0 ? SG_GEN_DONE_LENGTH : SG_GEN_RUNNING;
    }
    if (threadIdx.x == 0) ctl[SG_GEN_COUNT] = 0, ctl[SG_GEN_GO] = 0;
}

extern "C" sg_status sg_gen_begin_cuda(sg_ctx *ctx, sg_tensor *tok, sg_tensor *pos, sg_tensor *info, sg_tensor *ctl)
{
    gen_begin_kernel<<<1, 128, 0, stream_of(ctx)>>>((int32_t *)tok->data, (int32_t *)pos->data, (int32_t *)info->data,
                                                    (int)info->shape[0],
                                                    (int32_t *)ctl->data);
    SG_CUDA_CHECK_LAUNCH(ctx, "gen_begin_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

/* logits (B, V); one block per sequence (grid B). */
template <typename T>
__global__ void __launch_bounds__(GEN_THREADS)
    gen_sample_kernel(const T *logits, int V, int32_t *tok, int32_t *pos, int32_t *info, int32_t *out, int N,
                      int32_t *ctl, const float *temp)
{
    __shared__ float fsh[GEN_THREADS / 32];
    __shared__ int ish[GEN_THREADS / 32];
    __shared__ float chunk_start[GEN_THREADS + 1];
    __shared__ int token_sh;
    const int b = blockIdx.x, tid = threadIdx.x;
    int32_t *r = info + b * SG_GEN_INFO;
    const T *l = logits + (size_t)b * V;
    if (r[SG_GEN_DONE] == SG_GEN_RUNNING) {
        /* The largest logit, the lowest index on a tie: within a thread indices rise, so a
         * strict > keeps the first; across threads the pair compare below does. */
        float m = -INFINITY;
        int best = V;
        for (int v = tid; v < V; v += GEN_THREADS) {
            float x = to_f(l[v]);
            if (x > m || best == V) m = x, best = v;
        }
        for (int o = 16; o > 0; o >>= 1) {
            float om = __shfl_xor_sync(FULL_MASK, m, o);
            int ob = __shfl_xor_sync(FULL_MASK, best, o);
            if (om > m || (om == m && ob < best)) m = om, best = ob;
        }
        if ((tid & 31) == 0) fsh[tid >> 5] = m, ish[tid >> 5] = best;
        __syncthreads();
        m = fsh[0], best = ish[0];
        for (int k = 1; k < GEN_THREADS / 32; k++)
            if (fsh[k] > m || (fsh[k] == m && ish[k] < best)) m = fsh[k], best = ish[k];
        if (best >= V) best = 0; /* every logit NaN: as the reference, index 0 */
        const float t = *temp;
        const int topk = ctl[SG_GEN_TOPK];
        if (t <= 0.f || topk == 1) {
            if (tid == 0) token_sh = best;
        } else {
            uint32_t thr = 0;
            if (topk > 0 && topk < V)
                for (int bit = 31; bit >= 0; bit--) {
                    uint32_t cand = thr | (1u << bit);
                    int n = 0;
                    for (int v = tid; v < V; v += GEN_THREADS) n += sg_gen_order_key(to_f(l[v])) >= cand;
                    if (block_reduce(n, ish, add_op()) >= topk) thr = cand;
                }
            /* Contiguous chunks, summed in index order. */
            const int per = (V + GEN_THREADS - 1) / GEN_THREADS, v0 = tid * per, v1 = min(V, v0 + per);
            float cs = 0.f;
            int last = -1;
            for (int v = v0; v < v1; v++) {
                float x = to_f(l[v]);
                if (sg_gen_order_key(x) >= thr) cs += expf((x - m) / t), last = v;
            }
            __syncthreads();
            chunk_start[tid + 1] = cs;
            ish[0] = -1;
            __syncthreads();
            if (tid == 0) {
                chunk_start[0] = 0.f;
                for (int k = 0; k < GEN_THREADS; k++) chunk_start[k + 1] += chunk_start[k];
            }
            __syncthreads();
            if (last >= 0) atomicMax(&ish[0], last); /* the last kept token: an integer max */
            const float u = sg_gen_uniform((uint32_t)ctl[SG_GEN_SEED_LO], (uint32_t)ctl[SG_GEN_SEED_HI], (uint32_t)b,
                                           (uint32_t)r[SG_GEN_LEN]);
            const float target = u * chunk_start[GEN_THREADS];
            __syncthreads();
            if (tid == 0) token_sh = ish[0];
            __syncthreads();
            if (chunk_start[tid] <= target && target < chunk_start[tid + 1]) {
                float run = chunk_start[tid];
                for (int v = v0; v < v1; v++) {
                    float x = to_f(l[v]);
                    if (sg_gen_order_key(x) < thr) continue;
                    run += expf((x - m) / t);
                    if (run > target) {
                        token_sh = v;
                        break;
                    }
                }
            }
        }
        __syncthreads();
        if (tid == 0) {
            const int32_t tk = token_sh;
            int32_t n = r[SG_GEN_LEN];
            if (n < N) out[(size_t)b * N + n] = tk;
            r[SG_GEN_LEN] = ++n;
            tok[b] = tk;
            pos[b] = r[SG_GEN_PLEN] + n - 1;
            const int ns = ctl[SG_GEN_NSTOP];
            bool match = ns > 0 && n >= ns && n <= N;
            for (int k = 0; match && k < ns; k++) match = out[(size_t)b * N + n - ns + k] == ctl[SG_GEN_STOP + k];
            r[SG_GEN_DONE] = n >= r[SG_GEN_MAXNEW] ? SG_GEN_DONE_LENGTH : match ? SG_GEN_DONE_STOP : SG_GEN_RUNNING;
        }
    }
    /* The last block to get here sets GO from every sequence. */
    if (tid == 0) {
        __threadfence();
        if (atomicAdd(&ctl[SG_GEN_COUNT], 1) == (int)gridDim.x - 1) {
            __threadfence();
            const volatile int32_t *vi = info;
            int go = 0;
            for (int k = 0; k < (int)gridDim.x; k++) go |= vi[k * SG_GEN_INFO + SG_GEN_DONE] == SG_GEN_RUNNING;
            ctl[SG_GEN_GO] = go;
            ctl[SG_GEN_COUNT] = 0;
        }
    }
}

extern "C" sg_status sg_gen_sample_cuda(sg_ctx *ctx, const sg_tensor *logits, sg_tensor *tok, sg_tensor *pos,
                                        sg_tensor *info, sg_tensor *out, sg_tensor *ctl, const sg_tensor *temp)
{
    const int B = (int)logits->shape[0], V = (int)logits->shape[1], N = (int)out->shape[1];
    int32_t *tk = (int32_t *)tok->data, *ps = (int32_t *)pos->data, *in = (int32_t *)info->data;
    int32_t *o = (int32_t *)out->data, *cl = (int32_t *)ctl->data;
    if (logits->dtype == SG_DTYPE_BF16)
        gen_sample_kernel<__nv_bfloat16><<<B, GEN_THREADS, 0, stream_of(ctx)>>>(
            (const __nv_bfloat16 *)logits->data, V, tk, ps, in, o, N, cl, (const float *)temp->data);
    else
        gen_sample_kernel<float><<<B, GEN_THREADS, 0, stream_of(ctx)>>>((const float *)logits->data, V, tk, ps, in, o,
                                                                        N, cl, (const float *)temp->data);
    SG_CUDA_CHECK_LAUNCH(ctx, "gen_sample_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}
