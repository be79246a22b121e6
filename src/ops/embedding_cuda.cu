/* embedding_cuda.cu: token + position embedding kernels and their launchers. Storage type T:
 * f32, or bf16 for mixed precision (wte, wpe, y, dy, dwte, dwpe all bf16); math in f32, sums
 * in double, each output rounded once to T. One launch for the forward, one for the backward;
 * deterministic, no atomics.
 *
 * Forward: a thread per (row i, V consecutive columns), 16-byte accesses (4 f32 or 8 bf16)
 * where C and the pointers allow: y[i] = wte[tokens[i]] + wpe[i % T]; a token outside 0..V-1
 * reads as a zero row (no out-of-bounds read).
 *
 * Backward: block (row, chunk) owns EMB_BWD_THREADS (128) columns of one output row, a thread
 * per column. Rows 0..V-1 are dwte: the block scans the B*T tokens EMB_TILE at a time
 * (coalesced loads, a warp ballot per 32) and lists the tile's positions whose token is that
 * row in shared memory, in increasing order; then each thread adds dy[i, c] in double for the
 * listed positions in list order, with up to EMB_IN_FLIGHT loads of dy in flight ahead of its
 * adds (double-buffered batches). Rows no token used come out zero. Rows V..V+Tmax-1 are dwpe:
 * position t sums dy[b, t, c] over b in order (zero for t >= T), the same way. Every sum is
 * the reference's, term for term and in its order, so the results are bit for bit those of the
 * kernel before the lists, which loaded one dy value per add (the blocks of the most frequent
 * byte, the space, waited out ~400 load latencies in series: 83 us on the H100 for B*T =
 * 2048). What bounds the time now is those blocks' chains of dependent double adds, one per
 * use of the byte, so a block is narrow (128 columns) to spread the byte's row over more SMs.
 * Cost: the scan reads V*ceil(C/128)*B*T tokens (V = 256, B*T = 2048, C = 768: 3.1M 4-byte
 * loads, mostly from L1: the blocks on an SM read the same 8 KiB) and the sums read each dy
 * element once for dwte and once for dwpe. Sort-free and atomic-free; for a large vocabulary
 * (50k) the scan grows with V and a sort-based kernel would pay. */
#include "ops/embedding.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include "ops/dtype_cuda.cuh"

#define EMB_THREADS 256          /* forward block */
#define EMB_FWD_BLOCKS_PER_SM 16 /* forward grid cap (grid-stride beyond it) */
#define EMB_BWD_THREADS 128      /* backward block: the columns of one chunk */
#define EMB_BWD_WARPS (EMB_BWD_THREADS / 32)
#define EMB_SCAN 16                           /* backward: tokens a thread reads per tile ... */
#define EMB_TILE (EMB_BWD_THREADS * EMB_SCAN) /* ... positions listed per tile (8 KiB) */
#define EMB_IN_FLIGHT 32 /* backward: dy loads a thread has in flight ahead of its adds */
#define FULL_MASK 0xffffffffu

/* ---- forward ---- */

/* tokens (BT); wte (vocab, C); wpe (>= T, C); y (BT, C). C % V == 0. */
template <typename T, int V>
__global__ void __launch_bounds__(EMB_THREADS)
    emb_forward_kernel(const int *__restrict__ tokens, const T *__restrict__ wte,
                       const T *__restrict__ wpe, T *__restrict__ y, int64_t BT, int64_t T_len,
                       int64_t C, int64_t vocab)
{
    typedef vec_t<T, V> vec;
    const int64_t nv = C / V, n = BT * nv;
    const int64_t stride = (int64_t)gridDim.x * EMB_THREADS;
    for (int64_t k = (int64_t)blockIdx.x * EMB_THREADS + threadIdx.x; k < n; k += stride) {
        const int64_t i = k / nv, j = k % nv;
        const int tok = tokens[i];
        const vec p = reinterpret_cast<const vec *>(wpe + (i % T_len) * C)[j];
        vec out;
        if (tok >= 0 && tok < vocab) {
            const vec w = reinterpret_cast<const vec *>(wte + (int64_t)tok * C)[j];
#pragma unroll
            for (int e = 0; e < V; e++) out.e[e] = from_f<T>(to_f(w.e[e]) + to_f(p.e[e]));
        } else {
            out = p;
        }
        reinterpret_cast<vec *>(y + i * C)[j] = out;
    }
}

/* ---- backward ---- */

/* Entry i of a sum: list[i] (shared memory) when LIST, else i. */
template <bool LIST> __device__ __forceinline__ int64_t emb_entry(const int *list, int64_t i)
{
    return LIST ? (int64_t)list[i] : i;
}

/* acc + p[idx(0) * stride] + p[idx(1) * stride] + ... + p[idx(n-1) * stride], added in that
 * order in double, idx = emb_entry. Double-buffered batches of EMB_IN_FLIGHT: the loads of
 * batch k + 1 are issued, then batch k is added, so that many independent loads are in flight
 * behind the serial adds. */
template <typename T, bool LIST>
__device__ __forceinline__ double emb_sum_in_order(double acc, const T *p, const int *list,
                                                   int64_t n, int64_t stride)
{
    constexpr int W = EMB_IN_FLIGHT;
    T cur[W], next[W];
#pragma unroll
    for (int u = 0; u < W; u++)
        if (u < n) cur[u] = p[emb_entry<LIST>(list, u) * stride];
    for (int64_t i0 = 0; i0 < n; i0 += W) {
        if (i0 + 2 * W <= n) { /* the next batch is full: no bound checks */
#pragma unroll
            for (int u = 0; u < W; u++) next[u] = p[emb_entry<LIST>(list, i0 + W + u) * stride];
        } else {
#pragma unroll
            for (int u = 0; u < W; u++)
                if (i0 + W + u < n) next[u] = p[emb_entry<LIST>(list, i0 + W + u) * stride];
        }
#pragma unroll
        for (int u = 0; u < W; u++)
            if (i0 + u < n) acc += (double)to_f(cur[u]);
#pragma unroll
        for (int u = 0; u < W; u++) cur[u] = next[u];
    }
    return acc;
}

/* tokens (B*T); dy (B*T, C); dwte (vocab, C); dwpe (Tmax, C). Block b: output row b / chunks
 * (dwte rows first, then dwpe rows), columns (b % chunks)*EMB_BWD_THREADS + threadIdx.x. Every
 * branch on the row is uniform over the block, and every thread reaches every barrier (a
 * thread past column C-1 only skips its sum). */
template <typename T>
__global__ void __launch_bounds__(EMB_BWD_THREADS)
    emb_backward_kernel(const int *__restrict__ tokens, const T *__restrict__ dy,
                        T *__restrict__ dwte, T *__restrict__ dwpe, int64_t B, int64_t T_len,
                        int64_t C, int64_t vocab, int chunks)
{
    __shared__ int sh_list[EMB_TILE]; /* the tile's matching positions, from the tile start */
    __shared__ int sh_count[EMB_BWD_WARPS];
    const int64_t row = blockIdx.x / chunks;
    const int64_t c = (int64_t)(blockIdx.x % chunks) * EMB_BWD_THREADS + threadIdx.x;
    const bool col = c < C;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    double acc = 0;
    if (row < vocab) {
        const int v = (int)row;
        const int64_t BT = B * T_len;
        for (int64_t base = 0; base < BT; base += EMB_TILE) {
            /* Warp w scans tile positions [w*32*EMB_SCAN, (w+1)*32*EMB_SCAN): one ballot per
             * 32, the loads all issued first. */
            const int wpos = warp * 32 * EMB_SCAN;
            unsigned hits[EMB_SCAN];
            int count = 0;
#pragma unroll
            for (int k = 0; k < EMB_SCAN; k++) {
                const int64_t i = base + wpos + k * 32 + lane;
                hits[k] = __ballot_sync(FULL_MASK, i < BT && tokens[i] == v);
                count += __popc(hits[k]);
            }
            if (lane == 0) sh_count[warp] = count;
            __syncthreads();
            /* The warp's hits go after those of the warps before it, in position order. */
            int n = 0, at = 0;
            for (int w = 0; w < EMB_BWD_WARPS; w++) {
                at += w < warp ? sh_count[w] : 0;
                n += sh_count[w];
            }
            const unsigned below = (1u << lane) - 1u;
#pragma unroll
            for (int k = 0; k < EMB_SCAN; k++) {
                if ((hits[k] >> lane) & 1u)
                    sh_list[at + __popc(hits[k] & below)] = wpos + k * 32 + lane;
                at += __popc(hits[k]);
            }
            __syncthreads();
            if (col) acc = emb_sum_in_order<T, true>(acc, dy + base * C + c, sh_list, n, C);
            __syncthreads(); /* sh_list and sh_count are rewritten by the next tile */
        }
        if (col) dwte[row * C + c] = from_d<T>(acc);
    } else if (col) {
        const int64_t t = row - vocab;
        if (t < T_len)
            acc = emb_sum_in_order<T, false>(acc, dy + t * C + c, nullptr, B, T_len * C);
        dwpe[t * C + c] = from_d<T>(acc);
    }
}

/* ---- launchers ---- */

static bool aligned16(const void *p)
{
    return ((uintptr_t)p & 15u) == 0;
}

template <typename T, int V>
static void launch_forward(int blocks, cudaStream_t st, const sg_tensor *tokens,
                           const sg_tensor *wte, const sg_tensor *wpe, sg_tensor *y, int64_t BT,
                           int64_t T_len, int64_t C, int64_t vocab)
{
    emb_forward_kernel<T, V>
        <<<blocks, EMB_THREADS, 0, st>>>((const int *)tokens->data, (const T *)wte->data,
                                         (const T *)wpe->data, (T *)y->data, BT, T_len, C, vocab);
}

template <typename T>
static sg_status forward_t(sg_ctx *ctx, const sg_tensor *tokens, const sg_tensor *wte,
                           const sg_tensor *wpe, sg_tensor *y)
{
    constexpr int VEC = 16 / sizeof(T);
    const int64_t BT = tokens->numel, T_len = tokens->shape[1];
    const int64_t vocab = wte->shape[0], C = wte->shape[1];
    const bool vec =
        C % VEC == 0 && aligned16(wte->data) && aligned16(wpe->data) && aligned16(y->data);
    const int64_t per = vec ? VEC : 1;
    const int64_t want = (BT * (C / per) + EMB_THREADS - 1) / EMB_THREADS;
    const int64_t cap = (int64_t)sg_ctx_sm_count(ctx) * EMB_FWD_BLOCKS_PER_SM;
    const int blocks = (int)(want < 1 ? 1 : (want < cap ? want : cap));
    cudaStream_t st = (cudaStream_t)sg_ctx_stream(ctx);
    if (vec)
        launch_forward<T, VEC>(blocks, st, tokens, wte, wpe, y, BT, T_len, C, vocab);
    else
        launch_forward<T, 1>(blocks, st, tokens, wte, wpe, y, BT, T_len, C, vocab);
    SG_CUDA_CHECK_LAUNCH(ctx, "emb_forward_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

template <typename T>
static sg_status backward_t(sg_ctx *ctx, const sg_tensor *tokens, const sg_tensor *dy,
                            sg_tensor *dwte, sg_tensor *dwpe)
{
    const int64_t B = tokens->shape[0], T_len = tokens->shape[1];
    const int64_t vocab = dwte->shape[0], C = dwte->shape[1], Tmax = dwpe->shape[0];
    const int64_t chunks = (C + EMB_BWD_THREADS - 1) / EMB_BWD_THREADS;
    const int64_t blocks = (vocab + Tmax) * chunks;
    if (blocks > INT32_MAX || vocab > INT32_MAX)
        return sg_fail(ctx, SG_ERR_UNSUPPORTED,
                       "sg_embedding_backward: (%lld + %lld) rows of "
                       "%lld columns need %lld blocks; the CUDA kernel takes at most %d",
                       (long long)vocab, (long long)Tmax, (long long)C, (long long)blocks,
                       INT32_MAX);
    emb_backward_kernel<T><<<(int)blocks, EMB_BWD_THREADS, 0,
                             (cudaStream_t)sg_ctx_stream(ctx)>>>(
        (const int *)tokens->data, (const T *)dy->data, (T *)dwte->data, (T *)dwpe->data, B, T_len,
        C, vocab, (int)chunks);
    SG_CUDA_CHECK_LAUNCH(ctx, "emb_backward_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

extern "C" sg_status sg_embedding_forward_cuda(sg_ctx *ctx, const sg_tensor *tokens,
                                               const sg_tensor *wte, const sg_tensor *wpe,
                                               sg_tensor *y)
{
    switch (wte->dtype) {
    case SG_DTYPE_F32:
        return forward_t<float>(ctx, tokens, wte, wpe, y);
    case SG_DTYPE_BF16:
        return forward_t<__nv_bfloat16>(ctx, tokens, wte, wpe, y);
    default:
        return sg_fail(ctx, SG_ERR_DTYPE,
                       "sg_embedding_forward: 'wte' is %s; the CUDA kernel "
                       "takes f32 or bf16",
                       sg_dtype_name(wte->dtype));
    }
}

extern "C" sg_status sg_embedding_backward_cuda(sg_ctx *ctx, const sg_tensor *tokens,
                                                const sg_tensor *dy, sg_tensor *dwte,
                                                sg_tensor *dwpe)
{
    switch (dy->dtype) {
    case SG_DTYPE_F32:
        return backward_t<float>(ctx, tokens, dy, dwte, dwpe);
    case SG_DTYPE_BF16:
        return backward_t<__nv_bfloat16>(ctx, tokens, dy, dwte, dwpe);
    default:
        return sg_fail(ctx, SG_ERR_DTYPE,
                       "sg_embedding_backward: 'dy' is %s; the CUDA kernel "
                       "takes f32 or bf16",
                       sg_dtype_name(dy->dtype));
    }
}
