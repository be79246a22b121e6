/* stepgraph.h: the public C API of libstepgraph.
 *
 * stepgraph trains neural networks on NVIDIA GPUs (and, with the same API, on the CPU).
 * A minimal eager training loop reads:
 *
 *     sg_ctx *ctx;
 *     sg_ctx_options o = sg_ctx_options_default();          // backend auto: CUDA if a GPU is there
 *     if (sg_ctx_create(&o, &ctx) != SG_OK) { puts(sg_ctx_last_error(NULL)); return 1; }
 *     sg_model *m;  sg_model_create(ctx, "mlp-512-6-32", 1234, &m);
 *     sg_optim *opt; sg_optim_create(ctx, m, SG_OPTIM_ADAMW, &opt);
 *     for (int s = 0; s < steps; s++) {
 *         sg_model_load_batch(m, s);                         // synthetic teacher data, on device
 *         sg_model_forward(m); sg_model_backward(m); sg_optim_step(opt);
 *     }
 *     float loss; sg_model_loss_read(m, &loss);             // one host sync, after the steps
 *
 * Every function returns an sg_status; on failure sg_ctx_last_error(ctx) names the call, the
 * object and what was expected, and the context stays usable. Library code never exits.
 * Tensors are contiguous, row-major, up to 4-D; shapes are written (rows, cols) in comments.
 */
#ifndef STEPGRAPH_H
#define STEPGRAPH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status ------------------------------------------------------------------------------ */

typedef enum sg_status {
    SG_OK = 0,
    SG_ERR_INVALID,      /* a bad argument that is not one of the more specific kinds below */
    SG_ERR_NULL,         /* a required pointer was NULL */
    SG_ERR_SHAPE,        /* tensor shapes do not agree */
    SG_ERR_DTYPE,        /* a dtype the call does not take */
    SG_ERR_BACKEND,      /* tensors from another context or backend, or a backend not built */
    SG_ERR_OOM,          /* an allocation failed (or the context's allocation limit was hit) */
    SG_ERR_NO_DEVICE,    /* the CUDA backend was asked for and no usable GPU is there */
    SG_ERR_CUDA,         /* a CUDA runtime call failed */
    SG_ERR_CUBLAS,       /* a cuBLAS / cuBLASLt call failed */
    SG_ERR_NOT_READY,    /* an asynchronous result is not there yet: poll again */
    SG_ERR_CAPTURE,      /* a call that is forbidden while a graph is being captured */
    SG_ERR_IO,           /* a file could not be read or written */
    SG_ERR_UNSUPPORTED,  /* valid, but not implemented for this backend or dtype */
    SG_ERR_DIST          /* data parallelism: a peer rank failed or disagrees, or it timed out */
} sg_status;

/* The status's name, e.g. "SG_ERR_SHAPE". */
const char *sg_status_name(sg_status s);

/* ---- context ----------------------------------------------------------------------------- */

typedef enum sg_backend {
    SG_BACKEND_AUTO = 0,  /* CUDA when a GPU is present and the library was built with CUDA */
    SG_BACKEND_CPU,
    SG_BACKEND_CUDA
} sg_backend;

typedef struct sg_ctx sg_ctx;

typedef struct sg_ctx_options {
    sg_backend backend;
    int device;                 /* CUDA device ordinal */
    size_t workspace_bytes;     /* cuBLASLt workspace (one a stream), fixed for the context's life */
    size_t alloc_limit_bytes;   /* 0: none. Reserving past it fails with SG_ERR_OOM (tests) */
    int tf32;                   /* CUDA: f32 matmuls on the tensor cores in TF32 (inputs rounded to
                                 * 10 mantissa bits, f32 accumulation), as PyTorch's
                                 * torch.backends.cuda.matmul.allow_tf32; also STEPGRAPH_TF32=1 in
                                 * the environment. 0 (the default): true fp32. The CPU backend
                                 * refuses it (it computes in double). The fused f32 attention
                                 * with head size 64 runs in TF32 on the tensor cores too (its
                                 * other head sizes, and convolutions, stay in FMA). */
    int gemm_tune;              /* CUDA: 0 (the default) runs each matmul shape with cuBLASLt's
                                 * heuristic's first algorithm. N > 0 times the heuristic's first
                                 * candidates (N of them for N in 2..16; 1: up to 16) on a shape's
                                 * first call outside a capture, on that call's own operands, and
                                 * keeps the fastest if it beats the first by 3% or more, as
                                 * PyTorch's cudnn.benchmark does for convolutions; also
                                 * STEPGRAPH_GEMM_TUNE=N in the environment. A shape's choice is
                                 * fixed from its first call on, so eager and captured runs of one
                                 * context agree bit for bit, but two runs may choose differently
                                 * where candidates are close, and so differ in the last bits.
                                 * Accumulating calls (C the output itself) and shapes first met
                                 * inside a capture keep the heuristic's first. The CPU backend
                                 * refuses it. See docs/performance.md. */
} sg_ctx_options;

sg_ctx_options sg_ctx_options_default(void);

/* Creates a context: one non-blocking stream, one cuBLASLt handle and a workspace. A CUDA
 * context also has a second stream, with a workspace of its own, on which the library's linear
 * backwards run their weight-gradient matmuls beside the rest; its work is joined to the
 * context's stream before a call returns (or a built-in module's backward ends), so your work
 * on sg_ctx_stream sees it in order. STEPGRAPH_WGRAD=off in the environment makes none (see
 * docs/performance.md); a value other than off, side or defer fails the creation.
 * On failure *out is NULL and sg_ctx_last_error(NULL) says why. */
sg_status sg_ctx_create(const sg_ctx_options *opts, sg_ctx **out);
void sg_ctx_destroy(sg_ctx *ctx);

/* The last error message of ctx; with ctx NULL, this thread's last sg_ctx_create error. */
const char *sg_ctx_last_error(const sg_ctx *ctx);
sg_backend sg_ctx_backend(const sg_ctx *ctx);
const char *sg_backend_name(sg_backend b);
/* A short description: "NVIDIA H100 80GB HBM3 (sm_90)" or "CPU (reference backend)". */
const char *sg_ctx_device_name(const sg_ctx *ctx);
/* True when the library was built with CUDA and a GPU can be used. */
int sg_cuda_available(void);

/* Memory the context's tensors can still take, and its device's total, in bytes: the GPU's
 * (cudaMemGetInfo, plus what the caching allocator holds free), or the host's RAM on the CPU
 * backend; capped by the context's allocation limit. For size checks before building. */
sg_status sg_ctx_mem_info(sg_ctx *ctx, size_t *free_bytes, size_t *total_bytes);
/* Waits for all work queued on the context's stream. */
sg_status sg_ctx_sync(sg_ctx *ctx);
/* Kernels (and library matmuls) launched on the context so far: the runtime's own count. */
uint64_t sg_ctx_launch_count(const sg_ctx *ctx);

/* The work the context's ops have been asked for, by op family: the floating-point operations
 * of their matrix products and the fewest bytes each op must move through memory (each input
 * read once, each output written once). An op counts when it is called: eagerly, or once while
 * a capture records it; a graph's replays count nothing. What a step asks of the hardware,
 * against sg_device_peaks, gives its speed-of-light floor (sg_sol_floor). */
typedef enum sg_work_family {
    SG_WORK_MATMUL = 0,        /* linear layers: 2 M N K a product */
    SG_WORK_ATTENTION,         /* attention's products (causal: the triangle), softmax bytes */
    SG_WORK_CONV,              /* convolutions */
    SG_WORK_NORM,              /* LayerNorm, batch norm */
    SG_WORK_ELEMENTWISE,       /* activations, residual adds, dropout, embedding, pooling */
    SG_WORK_LOSS,
    SG_WORK_OPTIMIZER,         /* the update, loss scaling, clipping, gradient accumulation */
    SG_WORK_FAMILIES
} sg_work_family;
typedef struct sg_work {
    double flops[SG_WORK_FAMILIES];
    double bytes[SG_WORK_FAMILIES];
} sg_work;
const char *sg_work_family_name(sg_work_family f);  /* "matmul", "attention", ... */
/* The work counted on ctx so far (zeros for NULL). Differences of two readings are a region's. */
void sg_ctx_work(const sg_ctx *ctx, sg_work *out);

/* ---- memory: caching allocator and pools ------------------------------------------------- */

typedef struct sg_pool sg_pool;

typedef struct sg_alloc_stats {
    size_t bytes_in_use;        /* held by live tensors (rounded to size classes) */
    size_t bytes_reserved;      /* obtained from the device (cudaMalloc) or host */
    size_t peak_bytes_in_use;
    size_t peak_bytes_reserved;
    uint64_t device_allocs;     /* cudaMalloc (host: aligned_alloc) calls made */
    uint64_t device_frees;
    uint64_t cache_hits;        /* allocations served from the cache */
    uint64_t live_blocks;
} sg_alloc_stats;

/* A pool is an arena of its own: blocks freed into it are reused only by it. */
sg_status sg_pool_create(sg_ctx *ctx, const char *name, sg_pool **out);
/* Fails with SG_ERR_INVALID (and destroys nothing) while tensors of the pool are alive. */
sg_status sg_pool_destroy(sg_pool *pool);
/* New tensors of ctx come from pool (NULL: the context's default pool). */
sg_status sg_ctx_set_pool(sg_ctx *ctx, sg_pool *pool);
/* Statistics of one pool (NULL: the default pool). */
sg_status sg_pool_stats(const sg_ctx *ctx, const sg_pool *pool, sg_alloc_stats *out);
/* Statistics summed over all pools of the context. */
sg_status sg_ctx_alloc_stats(const sg_ctx *ctx, sg_alloc_stats *out);
/* Returns cached (free) blocks of every pool to the device. */
sg_status sg_ctx_empty_cache(sg_ctx *ctx);
/* Prints a human-readable summary of every pool. */
void sg_ctx_print_memory(const sg_ctx *ctx, FILE *f);

/* ---- tensors ----------------------------------------------------------------------------- */

typedef enum sg_dtype {
    SG_DTYPE_F32 = 0,
    SG_DTYPE_BF16,
    SG_DTYPE_F64,  /* CPU backend only: float64 gradient checks */
    SG_DTYPE_I32   /* class targets, segment tables */
} sg_dtype;

#define SG_MAX_DIMS 4

typedef struct sg_tensor sg_tensor;

size_t sg_dtype_size(sg_dtype dt);
const char *sg_dtype_name(sg_dtype dt);

/* A new contiguous tensor from the context's current pool. Contents are undefined. */
sg_status sg_tensor_create(sg_ctx *ctx, sg_dtype dt, int ndim, const int64_t *shape,
                           const char *name, sg_tensor **out);
/* A tensor that points into base's storage at elem_offset elements of base's dtype; it owns
 * nothing and must not outlive base. Used to lay all parameters in one allocation. */
sg_status sg_tensor_view(sg_tensor *base, int64_t elem_offset, int ndim, const int64_t *shape,
                         const char *name, sg_tensor **out);
/* Frees the tensor; its block returns to its pool's cache, stream-ordered (no sync). */
void sg_tensor_destroy(sg_tensor *t);

sg_dtype sg_tensor_dtype(const sg_tensor *t);
int sg_tensor_ndim(const sg_tensor *t);
int64_t sg_tensor_dim(const sg_tensor *t, int i);
int64_t sg_tensor_numel(const sg_tensor *t);
size_t sg_tensor_nbytes(const sg_tensor *t);
const char *sg_tensor_name(const sg_tensor *t);
/* Device (or host, on the CPU backend) address of the first element. */
void *sg_tensor_data(const sg_tensor *t);

/* Copies nbytes (must equal sg_tensor_nbytes) from host memory, queued on the context's stream.
 * The host buffer may be reused as soon as the call returns. */
sg_status sg_tensor_copy_from_host(sg_tensor *t, const void *src, size_t nbytes);
/* Copies the tensor to host memory and waits for it (a host sync). */
sg_status sg_tensor_copy_to_host(const sg_tensor *t, void *dst, size_t nbytes);
/* Device-to-device copy of equal-sized tensors, queued on the stream. */
sg_status sg_tensor_copy(sg_tensor *dst, const sg_tensor *src);
/* Sets every element to value (converted to the dtype), queued on the stream. */
sg_status sg_tensor_fill(sg_tensor *t, double value);
/* Adds value (converted to the dtype; an int32 tensor takes whole int32 values only) to every
 * element, queued on the stream: a device counter a conditional region tests (sg_graph_while)
 * can be counted down in the graph. */
sg_status sg_tensor_add_scalar(sg_tensor *t, double value);
/* Converts between f32 and bf16 (or equal dtypes) element by element. */
sg_status sg_tensor_convert(sg_tensor *dst, const sg_tensor *src);

/* Asynchronous read-back of a small tensor (a loss): start after queuing a step, poll later. */
typedef struct sg_readback sg_readback;
sg_status sg_readback_create(sg_ctx *ctx, size_t max_bytes, sg_readback **out);
void sg_readback_destroy(sg_readback *rb);
/* Queues a copy of t into pinned host memory and records an event; no host sync. */
sg_status sg_readback_start(sg_readback *rb, const sg_tensor *t);
/* SG_OK and copies the bytes into dst once the copy is done; SG_ERR_NOT_READY before. */
sg_status sg_readback_poll(sg_readback *rb, void *dst, size_t nbytes);
/* Waits for the copy, then copies the bytes into dst. */
sg_status sg_readback_wait(sg_readback *rb, void *dst, size_t nbytes);

/* ---- ops: forward and backward, CPU reference and CUDA kernels -------------------------- */

typedef enum sg_activation {
    SG_ACT_NONE = 0,
    SG_ACT_RELU,
    SG_ACT_GELU,     /* tanh approximation, as GPT-2 */
    SG_ACT_SILU,     /* x sigmoid(x): activation modules and batch norm only (no linear epilogue) */
    SG_ACT_SIGMOID   /* activation modules only */
} sg_activation;

/* y(M,N) = act(x(M,K) @ w(N,K)^T + b(N)). b may be NULL. w is stored (out, in) as PyTorch's.
 * pre(M,N): the pre-activation, written when act is GELU (needed by the backward), else NULL. */
sg_status sg_linear_forward(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *w,
                            const sg_tensor *b, sg_activation act, sg_tensor *y, sg_tensor *pre);
/* y(M,N) = x(M,K) @ w(N,K)^T + b(N) + r(M,N): a linear layer whose output joins a residual
 * stream, in one pass (a transformer block's last projection). b may be NULL; r has y's shape
 * and dtype and may be y itself (in place), else must not overlap it. y is rounded once (on
 * CUDA the matmul's epilogue adds r: cuBLASLt's C with beta 1), where sg_linear_forward then
 * sg_add_forward would round twice; except on CUDA with a bias not 16-byte aligned (a view),
 * which a second pass adds after the matmul has rounded x w^T + r. The backward is sg_linear_backward's with SG_ACT_NONE for
 * x, w and b; r's gradient is dy itself. */
sg_status sg_linear_forward_residual(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *w, const sg_tensor *b,
                                     const sg_tensor *r, sg_tensor *y);
/* Given dy(M,N): dx(M,K) (may be NULL: not needed), dw(N,K), db(N) (may be NULL).
 * act: the forward's activation; with RELU, act_in is the forward output y; with GELU, the
 * forward's pre. dy is overwritten with d(pre) when act is not NONE (it is scratch). */
sg_status sg_linear_backward(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *w,
                             sg_tensor *dy, sg_activation act, const sg_tensor *act_in,
                             sg_tensor *dx, sg_tensor *dw, sg_tensor *db);
/* The same for a layer whose input came from the layer before's activation, x = x_act(x_pre),
 * with the gradient taken on through that activation: instead of dx, dx_pre(M,K) =
 * x_act'(x_pre) * (d(pre) @ w), and x_db(K) (may be NULL) its column sums, the layer before's
 * bias gradient; that layer's backward then runs with SG_ACT_NONE and no db. x_act GELU (x_pre:
 * that layer's pre) or RELU (x_pre: its output y). x_db sums dx_pre as stored. On CUDA: the
 * matmul, then one kernel (in bf16 the product is rounded before the activation's factor too,
 * as sg_linear_backward then the layer before's backward would; the CPU reference rounds once).
 * With the environment variable STEPGRAPH_BGRAD=1, cuBLASLt's DGELU_BGRAD epilogue where it
 * applies (GELU, a 16-byte aligned x_pre and x_db, K a multiple of 8; x_db then sums the values
 * before rounding), and BGRADB for sg_linear_backward's db without an activation: measured
 * slower on the H100, where cuBLASLt runs both as kernels of their own (bench/RESULTS.md). */
sg_status sg_linear_backward_through(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *w, sg_tensor *dy,
                                     sg_activation act, const sg_tensor *act_in, sg_tensor *dw, sg_tensor *db,
                                     sg_activation x_act, const sg_tensor *x_pre, sg_tensor *dx_pre,
                                     sg_tensor *x_db);

/* Elementwise: y = relu(x); dx = dy * (x > 0). x and y may alias in the forward. */
sg_status sg_relu_forward(sg_ctx *ctx, const sg_tensor *x, sg_tensor *y);
sg_status sg_relu_backward(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *dy, sg_tensor *dx);
/* Elementwise GELU (tanh approximation) and its derivative. */
sg_status sg_gelu_forward(sg_ctx *ctx, const sg_tensor *x, sg_tensor *y);
sg_status sg_gelu_backward(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *dy, sg_tensor *dx);
/* Residual add: y = a + b (same shapes). Its backward is the identity on both inputs. */
sg_status sg_add_forward(sg_ctx *ctx, const sg_tensor *a, const sg_tensor *b, sg_tensor *y);

/* Fused softmax + cross-entropy over the last dim of logits(M,C) with int32 targets (M).
 * loss(1) = mean over rows whose target is >= 0 (a negative target masks the row out).
 * dlogits(M,C) = (softmax - onehot) * grad_scale / count, written in the same pass (may be
 * NULL: forward only). No probabilities are stored. Reductions are deterministic. */
sg_status sg_softmax_xent(sg_ctx *ctx, const sg_tensor *logits, const sg_tensor *targets,
                          float grad_scale, sg_tensor *loss, sg_tensor *dlogits);
/* The same, with dlogits also multiplied by the loss scale that lives on the device in
 * scaler[0] (see sg_amp_unscale), read by the kernel: dynamic loss scaling with no host sync.
 * scaler NULL: as sg_softmax_xent. The loss itself is never scaled. */
sg_status sg_softmax_xent_scaled(sg_ctx *ctx, const sg_tensor *logits, const sg_tensor *targets,
                                 float grad_scale, const sg_tensor *scaler, sg_tensor *loss,
                                 sg_tensor *dlogits);
/* Mean squared error: loss(1) = mean((x - t)^2); dx = 2 (x - t) * grad_scale / numel. */
sg_status sg_mse(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *target, float grad_scale,
                 sg_tensor *loss, sg_tensor *dx);

/* LayerNorm over the last dim C of x (M, C) (leading dims flatten into M):
 * y = (x - mean) * rstd * gamma + beta, rstd = 1/sqrt(var + eps) (biased variance).
 * mean (M), rstd (M): F32, saved for the backward. */
sg_status sg_layernorm_forward(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *gamma,
                               const sg_tensor *beta, float eps, sg_tensor *y, sg_tensor *mean,
                               sg_tensor *rstd);
/* dx (M, C), dgamma (C), dbeta (C) are written (not accumulated); reductions deterministic. */
sg_status sg_layernorm_backward(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *gamma,
                                const sg_tensor *mean, const sg_tensor *rstd, const sg_tensor *dy,
                                sg_tensor *dx, sg_tensor *dgamma, sg_tensor *dbeta);
/* The residual add fused with the LayerNorm after it (a pre-LayerNorm block's x2 = x + branch,
 * then LN2(x2)), in one pass: s = a + b (M, C) is written (the residual stream's next value,
 * rounded to the storage dtype as sg_add_forward rounds it), and y, mean, rstd are
 * sg_layernorm_forward of s as stored. Bit for bit what sg_add_forward then
 * sg_layernorm_forward write, on each backend. a, b, s, y of one shape and dtype; s and y must
 * not overlap any other tensor of the call (a and b may). */
sg_status sg_add_layernorm_forward(sg_ctx *ctx, const sg_tensor *a, const sg_tensor *b,
                                   const sg_tensor *gamma, const sg_tensor *beta, float eps,
                                   sg_tensor *s, sg_tensor *y, sg_tensor *mean, sg_tensor *rstd);
/* sg_layernorm_backward with the residual's gradient added to dx in the same pass:
 * dx = dres + LayerNorm's dx (for a residual x2 = x + f(LN(x)), dres = dx2 and dy = the
 * gradient f gives back to LN's output).
 * LayerNorm's dx is rounded to the storage dtype first, then the sum is rounded again: one
 * rounding more than the sum needs (up to half an ulp of LN's dx more error, which matters in
 * bf16), kept so that the result is bit for bit what sg_layernorm_backward then
 * sg_add_forward(dres, dx) write, on each backend. dres (M, C), of x's dtype, may be NULL:
 * then identical to sg_layernorm_backward. dx must not overlap dres (dres may be dy). */
sg_status sg_layernorm_backward_add(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *gamma,
                                    const sg_tensor *mean, const sg_tensor *rstd,
                                    const sg_tensor *dy, const sg_tensor *dres, sg_tensor *dx,
                                    sg_tensor *dgamma, sg_tensor *dbeta);
/* sg_layernorm_backward_add (dres required) that also writes two column sums over the M rows,
 * each in double and rounded once to the storage dtype: dres_sum (C), of dres, and dx_sum (C),
 * of dx as stored. Either may be NULL; dx, dgamma and dbeta are bit for bit
 * sg_layernorm_backward_add's. In a pre-LayerNorm block without dropout, x2 = x + P1(..) and
 * y = x2 + P2(f(LN2(x2))), LN2's call (dy its output's gradient, dres = dL/dy) gives P2's bias
 * gradient as dres_sum and P1's as dx_sum (dx = dL/dx2): both projections' backwards then run
 * with db NULL, each one pass over an (M, C) gradient fewer (the GPT block does this). */
sg_status sg_layernorm_backward_add_sums(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *gamma,
                                         const sg_tensor *mean, const sg_tensor *rstd,
                                         const sg_tensor *dy, const sg_tensor *dres, sg_tensor *dx,
                                         sg_tensor *dgamma, sg_tensor *dbeta, sg_tensor *dres_sum,
                                         sg_tensor *dx_sum);

/* Token + position embedding: y (B, T, C) = wte[tokens[b, t]] + wpe[t]; tokens (B, T) I32,
 * wte (V, C), wpe (Tmax >= T, C). A token outside 0..V-1 is an error on the CPU; on CUDA its
 * row reads as zeros (no out-of-bounds read). */
sg_status sg_embedding_forward(sg_ctx *ctx, const sg_tensor *tokens, const sg_tensor *wte,
                               const sg_tensor *wpe, sg_tensor *y);
/* dwte (V, C) and dwpe (Tmax, C) are written in full (rows no token used are zero),
 * deterministically (no float atomics). */
sg_status sg_embedding_backward(sg_ctx *ctx, const sg_tensor *tokens, const sg_tensor *dy,
                                sg_tensor *dwte, sg_tensor *dwpe);

/* Causal multi-head self-attention. qkv (B, T, 3C): q, k, v side by side, each C = heads x hs.
 * out (B, T, C); att (B, heads, T, T): the softmax probabilities, saved for the backward
 * (entries above the diagonal are 0). Scale 1/sqrt(hs). work: scratch of at least
 * sg_attention_work_elems(B, T, C, heads) F32 elements. */
int64_t sg_attention_work_elems(int64_t B, int64_t T, int64_t C, int heads);
sg_status sg_attention_forward(sg_ctx *ctx, const sg_tensor *qkv, int heads, sg_tensor *out,
                               sg_tensor *att, sg_tensor *work);
/* dqkv (B, T, 3C) is written; dout is not modified. */
sg_status sg_attention_backward(sg_ctx *ctx, const sg_tensor *qkv, const sg_tensor *att,
                                const sg_tensor *dout, int heads, sg_tensor *dqkv,
                                sg_tensor *work);

/* Fused causal attention: the same function as sg_attention_forward / _backward, without the
 * (B, heads, T, T) probabilities in memory (the flash-attention scheme: an online softmax over
 * tiles of keys, the probabilities recomputed in the backward). qkv, out, dout and dqkv as
 * above; lse (B, heads, T) F32: each row's log-sum-exp of its scaled scores, written by the
 * forward for the backward; delta (B, heads, T) F32: scratch the backward writes (dout . out
 * of each row). The backward reads the forward's out and lse, and is deterministic (no
 * atomics: a pass per query tile for dq, one per key tile for dk and dv). On CUDA it runs bf16
 * with head size 64 on the tensor cores (P and d(scores) rounded to bf16 before the products
 * that read them), and f32 with a head size that is a multiple of 4 up to 128 in f32 FMA (no
 * TF32), except under the context's tf32 option, where head size 64 runs the bf16 kernels'
 * scheme in TF32 (each operand rounded to 10 mantissa bits, f32 sums); other dtypes and head
 * sizes, and activations not 16-byte aligned, are SG_ERR_UNSUPPORTED there
 * (sg_attention_fused_supported says beforehand). The CPU reference takes f32, f64 and bf16,
 * any head size. */
int sg_attention_fused_supported(const sg_ctx *ctx, sg_dtype dtype, int64_t C, int heads);
sg_status sg_attention_fused_forward(sg_ctx *ctx, const sg_tensor *qkv, int heads, sg_tensor *out,
                                     sg_tensor *lse);
sg_status sg_attention_fused_backward(sg_ctx *ctx, const sg_tensor *qkv, const sg_tensor *out,
                                      const sg_tensor *lse, const sg_tensor *dout, int heads,
                                      sg_tensor *dqkv, sg_tensor *delta);
/* sg_attention_fused_backward, and dbias (3C, qkv's dtype) = dqkv's column sums over its B*T
 * rows (the values as stored): the qkv projection's bias gradient, so that the projection's
 * backward need not read dqkv again for it (pass its db as NULL). On CUDA the kernels sum each
 * 64-row tile's columns in f32 into parts (F32, at least sg_attention_fused_parts(B, T, C)
 * elements: scratch), and one more kernel adds the tiles in order, rounded once; bf16 only
 * there (SG_ERR_UNSUPPORTED otherwise). The CPU reference sums in double. Deterministic. */
int64_t sg_attention_fused_parts(int64_t B, int64_t T, int64_t C);
sg_status sg_attention_fused_backward_sums(sg_ctx *ctx, const sg_tensor *qkv, const sg_tensor *out,
                                           const sg_tensor *lse, const sg_tensor *dout, int heads,
                                           sg_tensor *dqkv, sg_tensor *delta, sg_tensor *dbias, sg_tensor *parts);

/* Dropout with a counter-based generator (Philox-4x32-10): the keep mask of element i at call
 * site `site` is a pure function of (seed, offset, site, i), where seed and offset live in rng
 * (4 I32 on the device: seed lo, seed hi, offset lo, offset hi). The backward at the same site
 * regenerates the same mask; sg_rng_advance adds one to the offset (the trainer: once per micro-batch), so replays
 * of a captured step draw fresh masks, and eager and captured runs with the same seed draw the
 * same ones. y = x * keep / (1 - p); p = 0 copies. */
sg_status sg_dropout_forward(sg_ctx *ctx, const sg_tensor *x, float p, const sg_tensor *rng,
                             uint32_t site, sg_tensor *y);
sg_status sg_dropout_backward(sg_ctx *ctx, const sg_tensor *dy, float p, const sg_tensor *rng,
                              uint32_t site, sg_tensor *dx);
sg_status sg_rng_advance(sg_ctx *ctx, sg_tensor *rng);

/* Global-norm gradient clipping over a flat buffer: norm = sqrt(sum g^2) (deterministic order,
 * in f64), g *= factor = min(1, max_norm / (norm + 1e-6)) (computed in f64 and, for f32
 * gradients, rounded once to f32, as PyTorch's clip_grad_norm_ keeps it in a tensor of the
 * gradients' dtype; the product rounded once); norm (1 F32) and nonfinite (1 I32: 1 when a value
 * is inf or NaN, then g is left unscaled) are written on the device. max_norm <= 0: only
 * measure. */
sg_status sg_clip_grad_norm(sg_ctx *ctx, sg_tensor *grad, float max_norm, sg_tensor *norm,
                            sg_tensor *nonfinite);
/* The same measurement on f32 gradients with the factor written to factor (1 F32, device: 1
 * when nothing would be scaled) and grad left as it is, so that the optimizer can clip as it
 * reads: grad * factor in f32 is sg_clip_grad_norm's grad bit for bit, so sg_clip_factor then
 * sg_adamw_step_amp (or sg_sgd_step_amp) with grad and factor for grad_lo and inv is
 * sg_clip_grad_norm then sg_adamw_step, without the pass that reads and writes the gradients
 * again. (With mixed precision see sg_clip_sumsq_amp: the unscale folded in too.) */
sg_status sg_clip_factor(sg_ctx *ctx, const sg_tensor *grad, float max_norm, sg_tensor *norm,
                         sg_tensor *nonfinite, sg_tensor *factor);
/* The same clipping over gradients split into n parts, e.g. a sharded optimizer's shares, a part
 * a rank. sums: I32 (2 n), opaque: element 2 i holds part i's f64 sum of squares as raw bytes
 * (F64 tensors exist on the CPU only), to be moved as they are (an all-gather of each rank's
 * 2 elements), never added as integers. sg_clip_sumsq writes part `part`'s sum of squares of
 * grad (f32; a deterministic order) there; once sums holds every part's, sg_clip_apply on each
 * part adds the n sums in part order in f64 (every caller gets the same bits), writes norm =
 * the square root and nonfinite (a part holds an inf or a NaN), and scales its part as
 * sg_clip_grad_norm does; sg_clip_factor_sums writes the factor instead, as sg_clip_factor.
 * One part (sums of 2): the pair is sg_clip_grad_norm (sg_clip_factor) bit for bit. No host
 * sync: a captured step can hold them. */
sg_status sg_clip_sumsq(sg_ctx *ctx, const sg_tensor *grad, sg_tensor *sums, int part);
/* sg_clip_sumsq of mixed precision's scaled gradients: grad_lo (BF16 or F32; F64 too on the
 * CPU) times inv (1 F32, device: sg_amp_check's 1 / scale), each product rounded to f32 as it
 * is read, summed in sg_clip_sumsq's order: bit for bit sg_clip_sumsq of what sg_amp_unscale
 * would write, without writing it. With sg_clip_factor_sums writing the factor into the second
 * element of a 2-element inv for the _amp steps (sg_tensor_view gives the halves), the chain
 * sg_amp_check, sg_clip_sumsq_amp, sg_clip_factor_sums, sg_adamw_step_amp is sg_amp_unscale,
 * sg_clip_grad_norm, sg_adamw_step bit for bit, reading the bf16 gradients twice and writing no
 * f32 ones. */
sg_status sg_clip_sumsq_amp(sg_ctx *ctx, const sg_tensor *grad_lo, const sg_tensor *inv, sg_tensor *sums,
                            int part);
sg_status sg_clip_apply(sg_ctx *ctx, sg_tensor *grad, float max_norm, const sg_tensor *sums, sg_tensor *norm,
                        sg_tensor *nonfinite);
sg_status sg_clip_factor_sums(sg_ctx *ctx, float max_norm, const sg_tensor *sums, sg_tensor *norm,
                              sg_tensor *nonfinite, sg_tensor *factor);

/* Dynamic loss scaling for mixed precision, entirely on the device. The scaler's state is a
 * device tensor of SG_SCALER_COUNT F32 laid out as sg_loss_scaler. The scale is a power of two,
 * so scaling and unscaling are exact. */
typedef struct sg_loss_scaler {
    float scale;            /* the loss scale (initially 65536) */
    float good_steps;       /* finite steps since the scale last changed */
    float growth_interval;  /* finite steps after which the scale doubles (PyTorch: 2000) */
    float skipped;          /* steps skipped so far because gradients were not finite */
} sg_loss_scaler;
#define SG_SCALER_COUNT 4
#define SG_LOSS_SCALE_MIN 0x1p-24f
#define SG_LOSS_SCALE_MAX 0x1p24f
/* grad (P, F32) = grad_lo (P, bf16 or F32; may be grad itself when F32) / scale, and found
 * (1, I32) = 1 when any element of grad is inf or NaN (one of grad_lo is, or, with a scale
 * below 1, its unscaled value overflows f32), else 0. In the same launch the
 * scaler updates: on found, the scale halves, good_steps = 0 and skipped += 1; otherwise
 * good_steps += 1, and when it reaches growth_interval the scale doubles and good_steps = 0.
 * The new scale is clamped to [SG_LOSS_SCALE_MIN, SG_LOSS_SCALE_MAX] (so an inf scale comes
 * back as the maximum, a NaN one as the minimum). Pass found to the optimizer's `skip` to
 * skip that step. */
sg_status sg_amp_unscale(sg_ctx *ctx, const sg_tensor *grad_lo, sg_tensor *grad,
                         sg_tensor *scaler, sg_tensor *found);
/* sg_amp_unscale's check and scaler update without writing the unscaled gradients: found and
 * the scaler exactly as sg_amp_unscale would leave them, and inv (1 F32, device) = 1 / scale,
 * the factor of this step (the scale before the update). For an optimizer that unscales as it
 * reads (sg_adamw_step_amp, sg_sgd_step_amp): the f32 gradients are never written, which saves
 * a pass that writes 4 bytes and reads 2 a parameter. */
sg_status sg_amp_check(sg_ctx *ctx, const sg_tensor *grad_lo, sg_tensor *scaler, sg_tensor *found,
                       sg_tensor *inv);

/* Optimizer hyperparameters, as they live in device memory (read by the kernels). */
typedef struct sg_optim_hparams {
    float lr, beta1, beta2, eps, weight_decay;  /* AdamW */
    float momentum, dampening;                   /* SGD (lr and weight_decay shared) */
    float step;                                  /* steps taken; the kernel increments it */
} sg_optim_hparams;

/* AdamW over a flat buffer of P elements cut into n_seg parameter tensors: seg_start
 * (n_seg+1, I32) holds each tensor's first element and P last; weight decay applies where
 * seg_decay (n_seg, I32) is nonzero. hp (8 F32): sg_optim_hparams in device memory, read by
 * the kernel; hp.step is incremented by one in the same launch. param/grad/m/v: F32 (P), or
 * m and v BF16 (P) (bf16 state: each new value rounded stochastically, see
 * sg_optim_set_state_dtype).
 * skip (1 I32, device; may be NULL): when nonzero the kernel changes nothing, hp.step
 * included (a step with non-finite gradients). param_lo (P, BF16; may be NULL): the compute
 * copy of mixed precision, written as bf16(param) in the same pass (left alone on a skip). */
sg_status sg_adamw_step(sg_ctx *ctx, sg_tensor *param, const sg_tensor *grad, sg_tensor *m,
                        sg_tensor *v, sg_tensor *hp, const sg_tensor *seg_start,
                        const sg_tensor *seg_decay, int n_seg, const sg_tensor *skip,
                        sg_tensor *param_lo);
/* SGD with momentum over the same layout: buf = momentum*buf + (1-dampening)*g (g includes
 * weight decay); param -= lr * buf. On the first step buf = g, as PyTorch. skip, param_lo and
 * a BF16 buf as for AdamW's m. */
sg_status sg_sgd_step(sg_ctx *ctx, sg_tensor *param, const sg_tensor *grad, sg_tensor *buf,
                      sg_tensor *hp, const sg_tensor *seg_start, const sg_tensor *seg_decay,
                      int n_seg, const sg_tensor *skip, sg_tensor *param_lo);
/* The same steps on the scaled gradients of mixed precision: grad_lo (P, BF16 or F32; F64 too
 * on the CPU) multiplied by inv (1 F32, device: sg_amp_check's) in f32 as each is read, the
 * value sg_amp_unscale would have written, so the result is bit for bit sg_amp_unscale followed
 * by sg_adamw_step / sg_sgd_step. Pass sg_amp_check's found as skip. inv may hold 2 F32: the
 * product is then multiplied by inv[1] (a clipping factor, sg_clip_factor_sums's) and rounded
 * again, bit for bit the unscale, then sg_clip_grad_norm, then the step. */
sg_status sg_adamw_step_amp(sg_ctx *ctx, sg_tensor *param, const sg_tensor *grad_lo, const sg_tensor *inv,
                            sg_tensor *m, sg_tensor *v, sg_tensor *hp, const sg_tensor *seg_start,
                            const sg_tensor *seg_decay, int n_seg, const sg_tensor *skip, sg_tensor *param_lo);
sg_status sg_sgd_step_amp(sg_ctx *ctx, sg_tensor *param, const sg_tensor *grad_lo, const sg_tensor *inv,
                          sg_tensor *buf, sg_tensor *hp, const sg_tensor *seg_start, const sg_tensor *seg_decay,
                          int n_seg, const sg_tensor *skip, sg_tensor *param_lo);


/* ---- vision ops: images channels last (N, H, W, C) ----------------------------------------- *
 *
 * Images are NHWC: cuDNN's Tensor Core convolutions on Hopper run natively channels last
 * (NCHW input is transposed internally), and batch norm, pooling and the elementwise ops then
 * reduce over contiguous channel vectors. Every op takes F32 or BF16 activations (the same dtype
 * for its inputs and outputs; per-channel statistics stay F32), and F64 on the CPU backend (for
 * gradient checks). The CPU backend is the reference; CUDA runs cuDNN (convolution) and
 * stepgraph's kernels (the rest). */

/* A 2-D convolution of fixed shapes: x (N, H, W, Cin), w (Cout, KH, KW, Cin / groups) (cuDNN's
 * channels-last filter; torchvision's (Cout, Cin / groups, KH, KW) permuted), b (Cout) or none,
 * y (N, OH, OW, Cout), OH = (H + 2 pad_h - dil_h (KH - 1) - 1) / stride_h + 1 (likewise OW).
 * Groups divide Cin and Cout (groups = Cin = Cout: depthwise). */
typedef struct sg_conv2d_params {
    int stride_h, stride_w;      /* >= 1 */
    int pad_h, pad_w;            /* >= 0 */
    int dil_h, dil_w;            /* >= 1 */
    int groups;                  /* >= 1 */
} sg_conv2d_params;
/* A plan: the shapes checked, on CUDA the cuDNN descriptors made and the algorithms of the
 * forward and both backward passes chosen once (fastest by cuDNN's heuristics, deterministic
 * ones only, so eager and replayed steps agree bit for bit), and one workspace allocated for
 * all three, so running a plan (captured or not) never allocates. dtype: of x, w, b, y and
 * their gradients. On CUDA it needs cuDNN 9 (a build without it: SG_ERR_UNSUPPORTED). */
typedef struct sg_conv2d sg_conv2d;
sg_status sg_conv2d_create(sg_ctx *ctx, const int64_t x_shape[4], const int64_t w_shape[4],
                           const sg_conv2d_params *p, sg_dtype dtype, sg_conv2d **out);
void sg_conv2d_destroy(sg_conv2d *c);
/* y's shape for the plan: (N, OH, OW, Cout). */
void sg_conv2d_out_shape(const sg_conv2d *c, int64_t y_shape[4]);
/* Bytes of device workspace the plan's passes use (0 on the CPU): of one workspace the
 * context's plans share (passes run one at a time on its stream), as large as the largest
 * plan's, allocated by the first pass run after a plan that needs more (so run a pass once
 * before capturing one). */
size_t sg_conv2d_workspace_bytes(const sg_conv2d *c);
/* y = conv(x, w) + b (b may be NULL). Shapes and dtypes must be the plan's. */
sg_status sg_conv2d_forward(sg_ctx *ctx, sg_conv2d *c, const sg_tensor *x, const sg_tensor *w,
                            const sg_tensor *b, sg_tensor *y);
/* Given dy: dx (may be NULL: not needed), dw, db (may be NULL), each written (not accumulated). */
sg_status sg_conv2d_backward(sg_ctx *ctx, sg_conv2d *c, const sg_tensor *x, const sg_tensor *w,
                             const sg_tensor *dy, sg_tensor *dx, sg_tensor *dw, sg_tensor *db);

/* Batch normalisation over the last dim C of x (M, C) (leading dims flatten: (N, H, W, C) is
 * M = N H W rows). training != 0: mean and biased variance of each channel over the M rows,
 * y = (x - mean) rstd gamma + beta, rstd = 1 / sqrt(var + eps); mean (C) and rstd (C) are
 * saved for the backward, and running_mean, running_var (C, on the device) become
 * (1 - momentum) r + momentum s with s the batch mean and the unbiased variance (as PyTorch;
 * M = 1 leaves running_var alone); both NULL: not tracked (training only). training == 0: the
 * running statistics normalise, mean and rstd are written from them, nothing is updated.
 * x and y (dy, dx) share one dtype; gamma, beta, mean, rstd, the running statistics (dgamma,
 * dbeta) are (C) F32, or F64 with F64 x. momentum in [0, 1], eps >= 0, both finite.
 * Deterministic reductions (no float atomics): the same inputs give the same bits. */
sg_status sg_batchnorm_forward(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *gamma,
                               const sg_tensor *beta, sg_tensor *running_mean,
                               sg_tensor *running_var, float momentum, float eps, int training,
                               sg_tensor *y, sg_tensor *mean, sg_tensor *rstd);
/* The training-mode backward, from the saved batch mean and rstd: dx (M, C), dgamma (C),
 * dbeta (C) written, not accumulated. */
sg_status sg_batchnorm_backward(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *gamma,
                                const sg_tensor *mean, const sg_tensor *rstd, const sg_tensor *dy,
                                sg_tensor *dx, sg_tensor *dgamma, sg_tensor *dbeta);
/* Batch norm fused with what follows it in a ResNet block, in one pass over the activations:
 * y = act(bn(x) + residual), act SG_ACT_NONE or SG_ACT_RELU, residual (M, C) in x's dtype or
 * NULL (none); the rest as sg_batchnorm_forward, which is this call with NULL, SG_ACT_NONE.
 * bn(x) is rounded to x's dtype only once, with the sum (not before it). */
sg_status sg_batchnorm_act_forward(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *gamma,
                                   const sg_tensor *beta, const sg_tensor *residual,
                                   sg_activation act, sg_tensor *running_mean,
                                   sg_tensor *running_var, float momentum, float eps, int training,
                                   sg_tensor *y, sg_tensor *mean, sg_tensor *rstd);
/* Its backward, given dy of y: g = dy where y > 0 (RELU; y: the forward's output, which gives
 * the mask as PyTorch's ReLU does; NULL with SG_ACT_NONE), else dy; dx, dgamma, dbeta the batch
 * norm backward of g, and dresidual = g (the residual's gradient; NULL: not wanted). dy is read
 * only. sg_batchnorm_backward is this call with SG_ACT_NONE, y and dresidual NULL. */
sg_status sg_batchnorm_act_backward(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *gamma,
                                    const sg_tensor *mean, const sg_tensor *rstd,
                                    sg_activation act, const sg_tensor *y, const sg_tensor *dy,
                                    sg_tensor *dx, sg_tensor *dresidual, sg_tensor *dgamma,
                                    sg_tensor *dbeta);

/* Max pooling of x (N, H, W, C) with a k x k window, stride and padding pad (padded positions
 * never win: they read as -inf; pad <= k / 2, as PyTorch, so every window holds an input),
 * y (N, OH, OW, C), OH = (H + 2 pad - k) / stride + 1 (likewise OW); argmax (N, OH, OW, C) I32:
 * the flat index h W + w within its image of each winner (the first in row-major order on
 * ties; a NaN wins, the first one), for the backward. The backward takes the forward's k,
 * stride and pad (it gathers: each element of dx sums, in window order, dy of the windows that
 * contain it and chose it), and writes dx (N, H, W, C) in full: deterministic, no atomics. */
sg_status sg_maxpool2d_forward(sg_ctx *ctx, const sg_tensor *x, int k, int stride, int pad,
                               sg_tensor *y, sg_tensor *argmax);
sg_status sg_maxpool2d_backward(sg_ctx *ctx, const sg_tensor *dy, const sg_tensor *argmax,
                                int k, int stride, int pad, sg_tensor *dx);
/* Global average pooling: y (N, C) = mean over H, W of x (N, H, W, C), one dtype; the backward
 * writes dy / (H W) at every position of dx (N, H, W, C). */
sg_status sg_avgpool_forward(sg_ctx *ctx, const sg_tensor *x, sg_tensor *y);
sg_status sg_avgpool_backward(sg_ctx *ctx, const sg_tensor *dy, sg_tensor *dx);

/* Elementwise SiLU y = x sigmoid(x) and sigmoid y = 1 / (1 + e^-x). SiLU's backward reads x,
 * sigmoid's its output y. x and y may alias in the forwards. */
sg_status sg_silu_forward(sg_ctx *ctx, const sg_tensor *x, sg_tensor *y);
sg_status sg_silu_backward(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *dy, sg_tensor *dx);
sg_status sg_sigmoid_forward(sg_ctx *ctx, const sg_tensor *x, sg_tensor *y);
sg_status sg_sigmoid_backward(sg_ctx *ctx, const sg_tensor *y, const sg_tensor *dy, sg_tensor *dx);
/* Squeeze-excitation's channel scaling: y (N, H, W, C) = x * s[n, c] with s (N, C) of x's
 * dtype; backward: dx = dy * s, ds[n, c] = sum over H, W of dy x (deterministic), both
 * written. */
sg_status sg_channel_scale_forward(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *s,
                                   sg_tensor *y);
sg_status sg_channel_scale_backward(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *s,
                                    const sg_tensor *dy, sg_tensor *dx, sg_tensor *ds);

/* ---- speed of light: the floor a step's work sets on this device ------------------------ *
 *
 * A step asks the hardware for its products' floating-point operations and its other ops'
 * bytes (sg_work: sg_ctx_work, sg_trainer_stats.work). Over this device's measured peaks, a
 * large matmul's rate and a large copy's bandwidth, each family's work takes at least
 * max(flops / rate, bytes / bandwidth); their sum is the step's floor, which no schedule of
 * the same work beats by much. A step's time over its floor says how far from the hardware it
 * runs, and the families' floors where the time should go. */
typedef struct sg_device_peaks {
    sg_dtype dtype;              /* of the matmul timed: F32 (TF32 if ctx's matmuls are) or BF16 */
    double matmul_tflops;        /* an (n x n) by (n x n) sg_linear_forward, n 8192 (bf16) or
                                  * 4096 (f32), on values that are not zero; the median of 5
                                  * (its algorithm chosen as ctx's are: gemm_tune) */
    double copy_gbps;            /* 1e9 bytes a second, read plus written, by sg_tensor_copy of
                                  * 1 GiB; the median of 5 */
    char device[320];
} sg_device_peaks;

/* Measures this device's peaks on a context of its own (about 1 s; about 2.5 GiB of device
 * memory, given back). CUDA only: SG_ERR_UNSUPPORTED on the CPU backend; dtype F32 or BF16. */
sg_status sg_device_peaks_measure(sg_ctx *ctx, sg_dtype dtype, sg_device_peaks *out);

typedef struct sg_sol {
    double family_ms[SG_WORK_FAMILIES];  /* max(flops / rate, bytes / bandwidth) of each */
    double floor_ms;                     /* their sum */
} sg_sol;

/* The floor of work w on peaks p, pure arithmetic. SG_ERR_NULL; SG_ERR_INVALID for peaks
 * that are not finite and > 0, or work that is negative or not finite. */
sg_status sg_sol_floor(const sg_work *w, const sg_device_peaks *p, sg_sol *out);

/* ---- graphs: capture once, replay with one launch ---------------------------------------- */

typedef struct sg_graph sg_graph;

/* A region of work to capture: it must queue the same operations on every call. */
typedef sg_status (*sg_step_fn)(void *user);

typedef struct sg_graph_options {
    const char *name;          /* named in errors and statistics */
    int warmup;                /* eager runs before capture (default 3): lazy set-up happens there */
    sg_pool *pool;             /* share this pool (graphs that never run at once); NULL: own pool */
    const sg_tensor *const *static_inputs;  /* tensors the graph reads that the caller refills */
    int n_static_inputs;
} sg_graph_options;

sg_graph_options sg_graph_options_default(void);

/* Runs fn `warmup` times eagerly, then records one run of it: on CUDA into a CUDA Graph
 * (thread-local capture on the context's stream), instantiated and uploaded; on the CPU into a
 * plan of the op calls. Allocations inside fn come from the graph's pool; after warm-up,
 * capture may not make new device allocations. Forbidden during capture (SG_ERR_CAPTURE, with a
 * message naming the call and the module): host reads of device values, syncs, new device
 * allocations, host-to-device copies, pool changes, nested capture. On failure nothing is
 * kept, *out is NULL, and the context works eagerly as before. */
sg_status sg_graph_capture(sg_ctx *ctx, sg_step_fn fn, void *user, const sg_graph_options *opts,
                           sg_graph **out);
/* Replays the recorded work with one launch. Refuses (SG_ERR_INVALID, naming the tensor) when a
 * static input was destroyed or rebound to other memory since capture. No allocation. */
sg_status sg_graph_replay(sg_graph *g);
/* Records fn again (same topology expected) and updates the executable graph in place with
 * cudaGraphExecUpdate; re-instantiates only when the update is refused. */
sg_status sg_graph_recapture(sg_graph *g);
/* Sets the arguments of the `occurrence`-th node (0-based, in capture order) that launches the
 * user kernel `func`, as a launch would take them (args[i] points at parameter i), without
 * re-capture (cudaGraphExecKernelNodeSetParams). CUDA only. */
sg_status sg_graph_kernel_set_args(sg_graph *g, const void *func, int occurrence, void **args);
/* Destroys the graph and, when it owns it, its pool (waits for replays in flight first). */
void sg_graph_destroy(sg_graph *g);
sg_pool *sg_graph_pool(const sg_graph *g);

typedef struct sg_graph_stats {
    int nodes;                 /* kernel, memcpy, memset... nodes (CPU: plan entries) */
    double capture_ms;         /* warm-up excluded */
    double instantiate_ms;     /* instantiate + upload */
    uint64_t replays;
    uint64_t captures;         /* the first, plus recaptures */
    uint64_t updates;          /* recaptures applied by cudaGraphExecUpdate */
    uint64_t reinstantiations; /* recaptures that needed a new executable graph */
    size_t exec_bytes;         /* device memory the executable graph took (free-memory delta) */
} sg_graph_stats;

sg_status sg_graph_get_stats(const sg_graph *g, sg_graph_stats *out);

/* ---- conditional regions: control flow decided on the device, inside a graph ---- *
 * A region of work that runs or repeats according to a device value the user's kernels (or
 * stepgraph's ops) write: an SG_DTYPE_I32 tensor of one element on ctx. Called eagerly, the
 * value is read to the host (a sync) and the body run as C would run it. Called during
 * sg_graph_capture, nothing is read: on CUDA the region becomes a conditional graph node (IF,
 * WHILE: CUDA 12.4, SWITCH: 12.8), its bodies captured from the functions, a one-thread
 * kernel before the node (and, for WHILE, at the end of the body) copying the value into the
 * node's condition; on the CPU a plan entry that reads the value at replay. So one captured
 * graph takes a different path on each replay without the host.
 *
 * In a body, CUDA allows kernels, memsets, copies and further conditional regions only:
 * collectives (data parallelism), events (sg_readback_start) and graph captures are refused
 * (SG_ERR_CAPTURE naming the call and the region) on every backend, eagerly too, so what runs
 * eagerly also captures; host reads, syncs and allocations are refused during capture, as
 * anywhere in a capture. Bodies of one region never run at once and may share buffers. A body must queue the same work on every call, as any captured step.
 * sg_graph_conditionals(ctx) says whether capture can make the nodes; where it cannot (a
 * driver or toolkit older than the versions above) the calls fail during capture with
 * SG_ERR_UNSUPPORTED, naming the versions, and work eagerly. */

/* Runs body(user) when *cond != 0. */
sg_status sg_graph_if(sg_ctx *ctx, const sg_tensor *cond, sg_step_fn body, void *user);
/* Runs body(user) while *cond != 0, the value read before each run: the body must update it
 * (a body that never clears it loops forever, on the device as on the host). */
sg_status sg_graph_while(sg_ctx *ctx, const sg_tensor *cond, sg_step_fn body, void *user);
/* Runs branches[*index](users[i]) when 0 <= *index < n (n 1..64), nothing otherwise. users
 * may be NULL (every branch gets NULL). */
sg_status sg_graph_switch(sg_ctx *ctx, const sg_tensor *index, int n, const sg_step_fn *branches,
                          void *const *users);
/* Bit i set: capture on ctx makes kind i's node (1 << SG_COND_IF ...); the CPU backend: all. */
typedef enum sg_cond_kind { SG_COND_IF = 0, SG_COND_WHILE, SG_COND_SWITCH } sg_cond_kind;
int sg_graph_conditionals(const sg_ctx *ctx);

/* True when STEPGRAPH_DISABLE_GRAPHS=1: every scope runs eagerly. */
int sg_graphs_disabled(void);
/* True while ctx is capturing. */
int sg_ctx_capturing(const sg_ctx *ctx);
/* Names the module whose work follows (errors during capture cite it); NULL clears it.
 * Returns the previous name so that nested modules can restore it. */
const char *sg_ctx_set_module(sg_ctx *ctx, const char *name);

/* ---- shape buckets: one graph per input shape, sharing one pool ------------------------- */

typedef struct sg_graph_cache sg_graph_cache;

typedef struct sg_graph_cache_stats {
    int cached;                /* graphs held now */
    uint64_t hits, misses;     /* sg_graph_cache_get calls that found / did not find a graph */
    uint64_t captures;         /* graphs captured (misses that succeeded) */
    uint64_t evictions;        /* graphs dropped to stay under the budget */
    uint64_t distinct_keys;    /* keys ever seen */
    size_t bytes;              /* estimated device bytes of the cached graphs */
    int recapture_warning;     /* set once captures pass the warning threshold (see create) */
    /* The graphs held now, summed (sg_graph_stats): nodes, replays, capture and instantiation
     * ms, executable graphs' bytes. */
    int nodes;
    uint64_t replays;
    double capture_ms, instantiate_ms;
    size_t exec_bytes;
} sg_graph_cache_stats;

/* A cache of graphs keyed by an integer shape key (e.g. the batch bucket). All its graphs
 * share one pool. budget_bytes: the estimated memory of cached graphs (sg_graph_stats's
 * exec_bytes, at least 1 KiB a node) above which least-recently-used graphs are destroyed
 * (0: no limit). warn_after: when captures exceed distinct keys by this many (re-captures of
 * evicted shapes), recapture_warning is set (0: 8). */
sg_status sg_graph_cache_create(sg_ctx *ctx, size_t budget_bytes, int warn_after,
                                sg_graph_cache **out);
void sg_graph_cache_destroy(sg_graph_cache *c);
/* The graph for key: cached, or captured now with fn/user/opts (its pool is the cache's). */
sg_status sg_graph_cache_get(sg_graph_cache *c, int64_t key, sg_step_fn fn, void *user,
                             const sg_graph_options *opts, sg_graph **out);
sg_status sg_graph_cache_get_stats(const sg_graph_cache *c, sg_graph_cache_stats *out);
/* The pool every graph of the cache allocates from (sg_pool_stats reads it). */
sg_pool *sg_graph_cache_pool(const sg_graph_cache *c);
/* The smallest of n_buckets sorted sizes that holds n, or -1 when n exceeds the largest. */
int64_t sg_bucket_for(const int64_t *buckets, int n_buckets, int64_t n);

/* ---- models, training -------------------------------------------------------------------- */

typedef struct sg_model sg_model;
typedef struct sg_optim sg_optim;

typedef enum sg_optim_kind { SG_OPTIM_ADAMW = 0, SG_OPTIM_SGD } sg_optim_kind;

/* Mixed precision's loss scaling (sg_model_options.loss_scaling). DYNAMIC: the loss's gradient
 * is multiplied by a scale on the device, the gradients are checked for inf and NaN after the
 * backward (a pass over them), a step whose gradients are not finite is skipped and the scale
 * halved, and the scale doubles after growth_interval finite steps (sg_loss_scaler). NONE: no
 * scale and no check, as PyTorch's bf16 autocast runs without a GradScaler (bf16 has f32's
 * exponent range, so gradients that are not finite come from values that already are). The
 * scaler's scale is 1 and nothing moves it (a resumed checkpoint keeps its counts, its scale set
 * to 1); no step is skipped, and a gradient that is not finite reaches the weights (and the next
 * loss: sg_trainer_options.stop_nonfinite stops such a run). It saves the check's pass and
 * launch: gpt-768-12-8-256 bf16 on an H200, 3.669 ms a step against 3.718 (bench/RESULTS.md,
 * session 41). Because scaling by a power of two is exact, a step's gradients and update under
 * NONE are bit for bit those of a DYNAMIC step whose scale neither overflowed nor underflowed
 * them. fp32 models ignore it: they are never scaled. */
typedef enum sg_loss_scaling { SG_LOSS_SCALING_DYNAMIC = 0, SG_LOSS_SCALING_NONE } sg_loss_scaling;

typedef struct sg_model_options {
    /* gpt: the text to train on (NULL: a licence text of the system). resnet, efficientnet: a
     * digits file (scikit-learn's 8 x 8 digits.csv: 64 gray levels 0..16 and the label a line;
     * docs/data.md) whose images, scaled up to R x R, replace the synthetic ones, the last
     * fifth held out as the validation split (NULL: synthetic images, no validation split). */
    const char *data_path;
    float dropout;             /* gpt: dropout probability after the embedding and each branch */
    /* SG_DTYPE_F32 (the default) or SG_DTYPE_BF16 (gpt): mixed precision. bf16 activations,
     * matmuls (f32 accumulation) and gradients, read from bf16 copies of the parameters; f32
     * master weights and optimizer state; dynamic loss scaling on the device, a step whose
     * gradients are not finite skipped by a device flag (sg_trainer_get_scaler), unless
     * loss_scaling is SG_LOSS_SCALING_NONE. */
    sg_dtype precision;
    /* Data parallelism: the model trains on part `shard` of `shards` equal parts of every batch
     * (rows shard*B/shards .. of the name's batch B, which they must divide) and builds its
     * buffers for B/shards rows, so `shards` models together see the rows one model of batch B
     * sees. 0 and 0 (or 1): the whole batch. */
    int shard, shards;
    /* gpt: a separate validation file, read as data_path is (NULL: the last 10% of data_path's
     * tokens are held out for validation). */
    const char *val_data_path;
    /* gpt: 0 reads data_path as bytes (vocabulary 256). N > 0: data_path (and val_data_path)
     * are token files, their format detected: an llm.c shard (a 256 x int32 header: magic
     * 20240520, version 1 for uint16 tokens or 2 for uint32, the token count) or nanoGPT's raw
     * little-endian uint16 train.bin / val.bin; every token must be below N, and the embedding
     * and the head have N rows (N may exceed the largest token: GPT-2's 50257 padded to 50304).
     * A bad file is refused, naming it and the byte offset, before the model is allocated. */
    int64_t vocab;
    /* resnet, efficientnet: classes of the head and the labels (0: 1000, ImageNet's, for the
     * synthetic images; 10 with a digits file as data_path, which refuses fewer). */
    int64_t classes;
    /* Activation recompute (sg_module_recompute): each GPT block, each ResNet stage (layer1 to
     * layer4) and each EfficientNet stage (features.1 to features.7) drops its activations
     * after the forward and computes them again in its backward. 0: off. */
    int recompute;
    /* bf16: dynamic loss scaling (the default) or none (sg_loss_scaling). */
    sg_loss_scaling loss_scaling;
} sg_model_options;

/* As sg_model_create, with options (NULL: defaults). "gpt-WIDTH-DEPTH-BATCH-SEQ" names a GPT
 * over bytes: heads = WIDTH/64, vocabulary 256. */
sg_status sg_model_create_ex(sg_ctx *ctx, const char *name, uint64_t seed,
                             const sg_model_options *opts, sg_model **out);
/* Builds a model from its canonical name, e.g. "mlp-512-6-32" (kind-width-depth-batch):
 * parameters in one allocation, initialised from seed; activations and gradients allocated
 * now, so steps allocate nothing. Fails with SG_ERR_INVALID on an unknown name. */
sg_status sg_model_create(sg_ctx *ctx, const char *name, uint64_t seed, sg_model **out);

/* What building a model takes, from its name and options alone (no context, nothing
 * allocated): a lower bound, as the allocator rounds blocks up. sg_model_create refuses a
 * model whose parameters, activations and data exceed the context's free memory
 * (sg_ctx_mem_info) before allocating, naming both figures. A name that is not a model
 * (every field a whole number in range, nothing after the last) gives SG_ERR_INVALID, the
 * message in sg_ctx_last_error(NULL). */
typedef struct sg_model_size {
    int64_t params;             /* parameter count */
    size_t param_bytes;         /* parameters and gradients (f32, plus bf16 copies under bf16) */
    size_t activation_bytes;    /* activations, their gradients and scratch of one step */
    size_t data_bytes;          /* the synthetic data set (mlp) or the token inputs (gpt) */
    size_t optim_bytes;         /* AdamW's two moments, made by sg_optim_create */
    size_t total_bytes;         /* all of the above */
} sg_model_size;
sg_status sg_model_estimate(const char *name, const sg_model_options *opts, sg_model_size *out);
/* What a built-in kind does, from its name alone (SG_ERR_INVALID for a name that is not one). */
typedef struct sg_model_traits {
    int sequence;               /* a sequence model over token text: sampling, sequence buckets,
                                 * a validation split, data paths, vocab, dropout */
    int mixed_precision;        /* bf16 precision */
    int dropout;
} sg_model_traits;
sg_status sg_model_kind_traits(const char *name, sg_model_traits *out);
void sg_model_destroy(sg_model *m);
const char *sg_model_name(const sg_model *m);
/* SG_DTYPE_F32, or SG_DTYPE_BF16 for a mixed-precision model. */
sg_dtype sg_model_precision(const sg_model *m);
int64_t sg_model_param_count(const sg_model *m);
/* Puts batch number `index` of the model's synthetic data set in the model's input tensors. */
sg_status sg_model_load_batch(sg_model *m, int64_t index);
/* Forward pass and loss (into a device scalar); backward pass into the gradient buffer. */
sg_status sg_model_forward(sg_model *m);
sg_status sg_model_backward(sg_model *m);
/* The loss tensor (1 element, device) and a blocking read of it. */
const sg_tensor *sg_model_loss(const sg_model *m);
/* The loss scaler on the device: SG_SCALER_COUNT F32 laid out as sg_loss_scaler (every model
 * has one; it moves under bf16), for an asynchronous read-back beside the loss. */
const sg_tensor *sg_model_loss_scaler(const sg_model *m);
sg_status sg_model_loss_read(sg_model *m, float *out);
/* The flat parameter and gradient buffers (all parameters, in layout order). */
sg_tensor *sg_model_params(sg_model *m);
/* The parameter tensors, in the flat buffer's order: how many, and each one's name (the
 * checkpoint's, e.g. "blocks.3.attn.qkv.weight"), offset into sg_model_params and elements. */
int sg_model_param_tensors(const sg_model *m);
sg_status sg_model_param_info(const sg_model *m, int i, const char **name, int64_t *offset, int64_t *numel);
/* The buffers (sg_module_declare_buffer) in one flat F32 tensor, NULL when the model has none;
 * their number, and buffer i's name, offset and elements, as for the parameters. */
sg_tensor *sg_model_buffers(sg_model *m);
int sg_model_buffer_tensors(const sg_model *m);
sg_status sg_model_buffer_info(const sg_model *m, int i, const char **name, int64_t *offset, int64_t *numel);
/* The f32 gradients. Under mixed precision the backward writes scaled bf16 gradients
 * (sg_model_grads_lo) and the step's unscale writes these; with one micro-batch the trainer's
 * step (and sg_optim_step) folds the unscale into the optimizer (sg_amp_check,
 * sg_adamw_step_amp; with clipping sg_clip_sumsq_amp too), and then these are not written: read
 * sg_model_grads_lo and divide by the scale the step used. With clipping
 * (sg_trainer_options.clip) the trainer's step leaves the gradients unclipped: the update
 * multiplies them by the clipping factor as it reads them (sg_clip_factor, or under mixed
 * precision sg_clip_factor_sums); STEPGRAPH_CLIP=separate writes these and scales them in
 * place first. */
sg_tensor *sg_model_grads(sg_model *m);
/* Mixed precision: the (P) BF16 gradients the backward writes, times the loss scale. NULL
 * for an fp32 model. */
sg_tensor *sg_model_grads_lo(sg_model *m);

sg_status sg_optim_create(sg_ctx *ctx, sg_model *m, sg_optim_kind kind, sg_optim **out);
void sg_optim_destroy(sg_optim *o);
/* Setters write the device copy with a stream-ordered kernel: no host sync, capture-safe. */
sg_status sg_optim_set_lr(sg_optim *o, float lr);
sg_status sg_optim_set_hparams(sg_optim *o, const sg_optim_hparams *hp);
/* Warm-up then cosine decay: lr rises linearly to peak over `warmup` steps, then follows a
 * half cosine down to floor at step `total`. step counts from 0. */
float sg_lr_warmup_cosine(int64_t step, int64_t warmup, int64_t total, float peak, float floor);
/* Reads the device hyperparameters back (a host sync). */
sg_status sg_optim_get_hparams(sg_optim *o, sg_optim_hparams *out);
/* One optimizer step over all parameters: one kernel launch (mixed precision: two, the check
 * of the gradients and the update, which unscales them as it reads them: sg_amp_check,
 * sg_adamw_step_amp). The optimizer's state is allocated by sg_trainer_create, or else by the
 * first step, which must then run before any capture of one (a graph's warm-up runs do). */
sg_status sg_optim_step(sg_optim *o);
/* The dtype the optimizer keeps its state in (AdamW's m and v, SGD's momentum buffer):
 * SG_DTYPE_F32 (the default) or SG_DTYPE_BF16 (f32 parameters only): half the state's memory,
 * and 8 bytes a parameter less for an AdamW step to move (a step is memory-bound). Each new state
 * value is computed in f32 and rounded to bf16 stochastically (unbiased; bits a pure function of
 * the step and the element, so runs stay deterministic): rounding to nearest would stall the
 * second moment, whose per-step change (1 - beta2 = 0.001 of it) is below half a bf16 unit.
 * The state is allocated, zeroed, in this dtype when sg_trainer_create (or the first step) needs
 * it, so setting the dtype right after sg_optim_create never holds f32 state; a state already
 * allocated is converted (its f32 memory goes back to the context's cache). Set it before the
 * optimizer's first step and before any capture: afterwards it is SG_ERR_INVALID (graphs hold the
 * old buffers).
 * A checkpoint holds the state in its dtype, so a run that loads one sets the same dtype first. */
sg_status sg_optim_set_state_dtype(sg_optim *o, sg_dtype dtype);
sg_dtype sg_optim_state_dtype(const sg_optim *o);

/* ---- your own models: modules, the builder, data sets ------------------------------------ *
 *
 * A model is a root module, a loss and a data set. An sg_builder makes one: create modules from
 * it (the built-in ones below, or your own from an sg_module_ops table, launching your own
 * kernels), each declaring its parameters by name; sg_builder_finish lays every parameter out in
 * one flat allocation (addresses never move), initialises them from a seed, and returns an
 * sg_model that sg_optim, sg_trainer (every scope, buckets, data parallelism), checkpoints,
 * verify and advise take as they take the built-in models, which are made the same way:
 *
 *     sg_builder_options bo = sg_builder_options_default();
 *     bo.batch = 32;
 *     sg_builder *b;  sg_builder_create(ctx, "my-net", &bo, &b);
 *     sg_module *l[3], *net;
 *     sg_module_linear(b, "fc1", 64, 128, 1, SG_ACT_NONE, &l[0]);
 *     my_rmsnorm_create(b, "norm", 128, &l[1]);               // a module of your own
 *     sg_module_linear(b, "head", 128, 10, 1, SG_ACT_NONE, &l[2]);
 *     sg_module_sequential(b, "net", l, 3, &net);
 *     sg_dataset *d;  sg_dataset_create(ctx, x, y, &d);        // x (n, 64) F32, y (n) I32
 *     sg_model *m;  sg_builder_finish(b, net, SG_LOSS_SOFTMAX_XENT, d, seed, &m);
 *
 * A module works on (rows, features) tensors: rows = batch, or batch x seq for sequence models
 * (sg_builder_rows). It allocates its outputs when it is created (in sg_builder_dtype: bf16
 * under mixed precision), so a step allocates nothing and any module can be captured. */

/* The host generator parameters are initialised with (splitmix64): the same seed gives the
 * same values on every backend. For data of your own drawn the same way. */
typedef struct sg_rng {
    uint64_t state;
} sg_rng;
uint64_t sg_rng_next(sg_rng *r);
double sg_rng_uniform(sg_rng *r);            /* [0, 1) */
double sg_rng_normal(sg_rng *r);             /* N(0, 1), Box-Muller */

/* Sets ctx's last error (sg_ctx_last_error) to the formatted message and returns st: for your
 * own modules' errors, reported as the library reports its own. */
sg_status sg_ctx_fail(sg_ctx *ctx, sg_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

typedef struct sg_builder sg_builder;
typedef struct sg_module sg_module;
typedef struct sg_dataset sg_dataset;

typedef enum sg_init {
    SG_INIT_UNIFORM_FAN_IN = 0,  /* U(-1/sqrt(fan_in), 1/sqrt(fan_in)): PyTorch's Linear default */
    SG_INIT_ZEROS,
    SG_INIT_ONES,
    SG_INIT_NORMAL_002           /* N(0, 0.02): GPT-2 */
} sg_init;

/* A module of your own: its passes, as the built-in modules implement them. */
typedef struct sg_module_ops {
    const char *kind;            /* "rmsnorm": named in errors */
    /* Reads x (rows, in), writes the module's own output tensor and returns it through *y.
     * Queue the work on the context's stream (sg_ctx_stream, CUDA backend) or compute it on
     * the host (CPU backend: it is your reference). No host sync, no allocation: both are
     * forbidden while a graph is captured. Keep x: the backward needs it. */
    sg_status (*forward)(sg_module *m, const sg_tensor *x, const sg_tensor **y);
    /* Given dy (rows, out), which the module may overwrite (it is scratch), writes the
     * gradients of its parameters (sg_module_param_grad: overwritten, not accumulated) and the
     * input gradient into a tensor of its own, returned through *dx; when
     * sg_module_needs_input_grad(m) is 0 (the model's first module) it may skip that and
     * return NULL. */
    sg_status (*backward)(sg_module *m, sg_tensor *dy, sg_tensor **dx);
    /* Optional (NULL: the module keeps its rows, and variable shapes are refused): run the
     * next passes on the first `rows` rows of its buffers (sg_tensor_set_rows). */
    sg_status (*set_rows)(sg_module *m, int64_t rows);
    /* Optional: frees what the state holds (its tensors too); the library frees the module. */
    void (*destroy)(sg_module *m);
} sg_module_ops;

typedef struct sg_builder_options {
    int64_t batch;               /* rows of a batch (the whole batch under data parallelism) */
    int64_t seq;                 /* sequence models: positions a row; modules see batch*seq rows
                                  * (0: not a sequence model) */
    sg_dtype precision;          /* SG_DTYPE_F32, or SG_DTYPE_BF16: mixed precision (bf16
                                  * activations, gradients and parameter copies; f32 masters) */
    float dropout;               /* the probability the built-in modules drop with (0: none) */
    int shard, shards;           /* data parallelism: this model is part `shard` of `shards`
                                  * (0 and 0: the whole batch); buffers hold batch/shards rows */
    sg_loss_scaling loss_scaling; /* bf16: dynamic (the default) or none (sg_loss_scaling) */
} sg_builder_options;

sg_builder_options sg_builder_options_default(void);
/* Starts a model named `name` (checkpoints record it; up to 63 characters). */
sg_status sg_builder_create(sg_ctx *ctx, const char *name, const sg_builder_options *opts,
                            sg_builder **out);
/* Abandons an unfinished model: every module made from b and b itself. */
void sg_builder_destroy(sg_builder *b);
sg_ctx *sg_builder_ctx(const sg_builder *b);
/* Rows the modules' buffers hold: batch/shards, times seq for sequence models. */
int64_t sg_builder_rows(const sg_builder *b);
/* The dtype of activations and their gradients: the precision. */
sg_dtype sg_builder_dtype(const sg_builder *b);
/* Modules created until the matching pop have "<scope>." before their names: nested scopes
 * give hierarchical names ("blocks.3" then "attn": "blocks.3.attn.qkv.weight"). A pop ends the
 * last push, dots and all; a pop with nothing pushed does nothing. */
sg_status sg_builder_push_scope(sg_builder *b, const char *scope);
void sg_builder_pop_scope(sg_builder *b);
/* A buffer every module that asks by the same name shares (backward scratch that only one
 * module's pass uses at a time); owned by the model. The same name must come with the same
 * dtype and shape. NULL on failure (sg_ctx_last_error). */
sg_tensor *sg_builder_shared(sg_builder *b, const char *name, sg_dtype dt, int ndim,
                             const int64_t *shape);

typedef enum sg_loss_kind {
    SG_LOSS_SOFTMAX_XENT = 0,    /* logits (rows, classes), I32 targets (rows): negative masks */
    SG_LOSS_MSE                  /* outputs (rows, d), F32 targets of the same shape */
} sg_loss_kind;

/* Finishes the model: root's output is the loss's input, the data set's samples are its
 * inputs and targets. Parameters are allocated in one flat buffer in declaration order and
 * initialised from seed. Takes root, every module and data (and frees b) whatever it
 * returns; on failure *out is NULL. */
sg_status sg_builder_finish(sg_builder *b, sg_module *root, sg_loss_kind loss, sg_dataset *data,
                            uint64_t seed, sg_model **out);

/* A module of your own, named `name` in the builder's scope; state is yours (ops->destroy). */
sg_status sg_module_create(sg_builder *b, const char *name, const sg_module_ops *ops, void *state,
                           sg_module **out);
void *sg_module_state(const sg_module *m);
sg_ctx *sg_module_ctx(const sg_module *m);
const char *sg_module_name(const sg_module *m);
/* Declares a parameter of m named "<module's name>.<name>" (the checkpoint's name), shape
 * (ndim dims), initialised by init (fan_in: the bound of SG_INIT_UNIFORM_FAN_IN), with weight
 * decay when decay is nonzero. Returns its handle (>= 0), or -1 with the reason in
 * sg_ctx_last_error. Before sg_builder_finish only. */
int sg_module_param(sg_module *m, const char *name, int ndim, const int64_t *shape, sg_init init,
                    int64_t fan_in, int decay);
/* After sg_builder_finish: parameter p as the passes read it (its bf16 copy under mixed
 * precision, else the f32 master), and its gradient, which the backward writes (same dtype). */
sg_tensor *sg_module_param_tensor(const sg_module *m, int p);
sg_tensor *sg_module_param_grad(const sg_module *m, int p);
/* After sg_builder_finish: 0 for the model's first module (its input gradient is unused). */
int sg_module_needs_input_grad(const sg_module *m);
/* A buffer: state of the module that is not trained (BatchNorm's running statistics). F32 on
 * the device, named as parameters are ("<scope>.<module>.<name>", unique among parameters and
 * buffers), filled with zeros or ones (init SG_INIT_ZEROS or SG_INIT_ONES) when the model is
 * built, saved in checkpoints by name and compared by sg_verify; the module's passes update it
 * themselves (the optimizer never sees it). Under data parallelism each rank keeps its own.
 * Returns its handle, or -1 with the context's error. */
int sg_module_declare_buffer(sg_module *m, const char *name, int ndim, const int64_t *shape,
                             sg_init init);
/* After sg_builder_finish: buffer b's tensor. */
sg_tensor *sg_module_buffer_tensor(const sg_module *m, int b);
/* 1 in training passes, 0 in evaluation passes (sg_trainer_eval: no dropout, and BatchNorm
 * reads its running statistics instead of updating them). */
int sg_module_training(const sg_module *m);
/* 1 when a pass may update m's buffers: a training pass that is not a recompute region's
 * second forward (sg_module_recompute), which must leave them as the first one did. A module
 * of your own with buffers updates them only when this says so. */
int sg_module_updates_buffers(const sg_module *m);
/* A module not (yet) handed to a container or a model. */
void sg_module_destroy(sg_module *m);

/* The built-in modules. Parameters are named as PyTorch names them ("fc1.weight"). */
/* y (rows, out) = act(x (rows, in) W^T + b): weight (out, in), bias (out) when `bias`; the
 * activation fused into the matmul's epilogue. */
sg_status sg_module_linear(sg_builder *b, const char *name, int64_t in, int64_t out, int bias,
                           sg_activation act, sg_module **m);
/* The same with another initialisation of the weight (the bias, when there is one, starts at
 * zero under SG_INIT_NORMAL_002, as GPT-2's). */
sg_status sg_module_linear_init(sg_builder *b, const char *name, int64_t in, int64_t out, int bias,
                                sg_activation act, sg_init init, sg_module **m);
/* y = act(x) elementwise, x (rows, features): any sg_activation (SILU and SIGMOID included). */
sg_status sg_module_activation(sg_builder *b, const char *name, sg_activation act,
                               int64_t features, sg_module **m);
/* LayerNorm over the last dim: weight (C) ones, bias (C) zeros, no weight decay. */
sg_status sg_module_layernorm(sg_builder *b, const char *name, int64_t C, float eps,
                              sg_module **m);
/* Token + position embedding of a sequence model: tokens (batch, seq) I32 -> (rows, C);
 * "<name>.wte.weight" (vocab, C) and "<name>.wpe.weight" (seq, C), N(0, 0.02) (an empty name:
 * "wte.weight", as GPT-2), then dropout with the builder's probability. */
sg_status sg_module_embedding(sg_builder *b, const char *name, int64_t vocab, int64_t C,
                              sg_module **m);
/* Causal multi-head self-attention of a sequence model, x (rows, C) -> (rows, C): "qkv"
 * Linear(C, 3C), attention over `heads` heads, "proj" Linear(C, C), then dropout. */
sg_status sg_module_attention(sg_builder *b, const char *name, int64_t C, int heads,
                              sg_module **m);
/* Dropout with the builder's probability (identity when 0 or when evaluating). */
sg_status sg_module_dropout(sg_builder *b, const char *name, int64_t features, sg_module **m);
/* y = x + inner(x); takes inner. */
sg_status sg_module_residual(sg_builder *b, const char *name, sg_module *inner, int64_t features,
                             sg_module **m);
/* A GPT-2 block, x (rows, C): x += attention(ln1(x)); x += proj(gelu(fc(ln2(x)))), with the
 * builder's dropout after each branch; its backward scratch shared by every block. */
/* 1 where sg_module_attention and sg_module_gpt_block of this precision, width and heads run
 * the fused attention (sg_attention_fused_forward: bf16 and f32 with head size 64, on either
 * backend, unless STEPGRAPH_ATTENTION=unfused is set), saving (B, heads, T) log-sum-exps
 * instead of the (B, heads, T, T) probabilities; 0 where they run sg_attention_forward. */
int sg_module_attention_fused(sg_dtype precision, int64_t C, int heads);
sg_status sg_module_gpt_block(sg_builder *b, const char *name, int64_t C, int heads,
                              sg_module **m);
/* Vision modules: a batch of images NHWC, (rows, H, W, C), in and out (the vision ops' layout);
 * each module is made for one input size (H, W, C) and knows its output's. Activations in the
 * builder's precision, f32 or bf16 (mixed precision: batch norm keeps f32 statistics and reads
 * the f32 master weight and bias); a bf16 model's first convolution takes f32 images. */
/* 2-D convolution, (rows, H, W, Cin) -> (rows, OH, OW, Cout): "<name>.weight" (Cout, k, k,
 * Cin / groups) (channels-last: torchvision's (Cout, Cin / groups, k, k) permuted), initialised
 * U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with fan_in = Cin / groups k k (PyTorch's default);
 * "<name>.bias" (Cout) the same when bias. */
sg_status sg_module_conv2d(sg_builder *b, const char *name, int64_t H, int64_t W, int64_t Cin,
                           int64_t Cout, int k, int stride, int pad, int groups, int bias,
                           sg_module **m);
/* Batch norm over the channels of (rows, H, W, C), then act (SG_ACT_NONE, SG_ACT_RELU fused
 * into the op, or SG_ACT_SILU, which keeps the normalised values for its backward): "<name>.weight" (C) ones and "<name>.bias" (C) zeros, no weight decay; buffers
 * "<name>.running_mean" (zeros) and "<name>.running_var" (ones); momentum 0.1, eps 1e-5
 * (PyTorch's). Training passes normalise with the batch's statistics and update the running
 * ones; evaluation passes normalise with the running ones. */
sg_status sg_module_batchnorm2d(sg_builder *b, const char *name, int64_t H, int64_t W, int64_t C,
                                sg_activation act, sg_module **m);
/* Max pooling, k x k windows, stride and padding pad (pad <= k / 2; padding never wins): (rows, H, W, C) -> (rows, OH, OW, C). */
sg_status sg_module_maxpool2d(sg_builder *b, const char *name, int64_t H, int64_t W, int64_t C,
                              int k, int stride, int pad, sg_module **m);
/* Global average pooling: (rows, H, W, C) -> (rows, C). */
sg_status sg_module_avgpool(sg_builder *b, const char *name, int64_t H, int64_t W, int64_t C,
                            sg_module **m);
/* ResNet's block: y = act(main(x) + shortcut(x)), shortcut NULL for the identity (then main
 * keeps x's shape); takes main and shortcut. out_shape: (OH, OW, C) of y, main's output. When
 * main ends in a batch norm made with SG_ACT_NONE (main itself, or the last module of nested
 * sequentials), that batch norm adds the shortcut and applies act in its own pass
 * (sg_batchnorm_act_forward) and its output is the block's; the shortcut runs first. */
sg_status sg_module_residual_block(sg_builder *b, const char *name, sg_module *main,
                                   sg_module *shortcut, const int64_t in_shape[3],
                                   const int64_t out_shape[3], sg_activation act, sg_module **m);
/* EfficientNet's squeeze-excitation, (rows, H, W, C) -> the same: y = x * sigmoid(fc2(silu(
 * fc1(avgpool(x))))) per image and channel; "<name>.fc1.weight" (Csq, C), "<name>.fc1.bias"
 * (Csq), "<name>.fc2.weight" (C, Csq), "<name>.fc2.bias" (C) (torchvision's 1x1 convolutions:
 * the same data as (out, in, 1, 1)), PyTorch's default bounds 1/sqrt(in). */
sg_status sg_module_squeeze_excitation(sg_builder *b, const char *name, int64_t H, int64_t W,
                                       int64_t C, int64_t Csq, sg_module **m);
/* Stochastic depth, torchvision's "row" mode, (rows, H, W, C) -> the same: in training passes
 * each image is zeroed with probability p, else scaled by 1 / (1 - p) (the identity when
 * evaluating or p = 0), drawn from the builder's dropout generator as sg_module_dropout draws
 * (reproducible, the same under every scope). The trainer moves that generator on each step
 * only for a builder whose dropout is above 0: p > 0 with a builder's dropout of 0 is refused. */
sg_status sg_module_stochastic_depth(sg_builder *b, const char *name, int64_t H, int64_t W,
                                     int64_t C, float p, sg_module **m);
/* Runs children in order forward, in reverse backward; takes them (n up to 4096). Under
 * layer scope, the root Sequential's children are the modules captured one by one. */
sg_status sg_module_sequential(sg_builder *b, const char *name, sg_module **children, int n,
                               sg_module **m);
/* Activation recompute. The modules made between sg_builder_begin_recompute(b) and
 * sg_module_recompute(b, name, inner, &m) form a region; inner is its one module no container
 * owns (every other module made in between belongs to it). The built-in modules of a region
 * keep their activations and backward scratch in one device arena that every region of the
 * model shares, sized for the largest region when the model is built. m runs inner: its
 * forward keeps only inner's output (copied out of the arena); its backward runs inner's
 * forward again on the saved input, then inner's backward (the input gradient copied out of
 * the arena too, into a buffer shared with every second region). Memory saved: the buffers
 * of every region but the largest; cost: one more forward of each region a step. Results are
 * the same as without recompute, bit for bit where the kernels are deterministic: dropout and
 * stochastic depth draw the same masks again (counter-based generator), batch norm moves its
 * running statistics once. A module of your own inside a region must give the same output
 * when its forward runs twice and update its buffers only when sg_module_updates_buffers(m)
 * says so; tensors it makes itself (sg_tensor_create) stay its own.
 * Regions do not nest; one left open fails sg_builder_finish. Works under every scope (under
 * layer scope, m is the module captured) and with data parallelism. */
sg_status sg_builder_begin_recompute(sg_builder *b);
sg_status sg_module_recompute(sg_builder *b, const char *name, sg_module *inner, sg_module **m);

/* Data sets, resident on the device: a step gathers its own batch there (a captured step
 * loads its batch with no host work). Batch i of a model of batch B holds samples
 * (i*B + r) mod n, r = 0..B-1, in order; a data-parallel shard takes its rows of it. */
/* Takes x (n, ...) F32 or I32 and y (n, ...) I32 (class targets) or F32 (MSE targets), made on
 * ctx with equal first dims, whatever it returns. */
sg_status sg_dataset_create(sg_ctx *ctx, sg_tensor *x, sg_tensor *y, sg_dataset **out);
/* The same from two .npy files (C order; x: <f4 or <i4, y: <i4 or <f4, up to 4 dims); a bad
 * file is refused naming it and what is wrong. */
sg_status sg_dataset_from_npy(sg_ctx *ctx, const char *x_path, const char *y_path,
                              sg_dataset **out);
/* Token text for sequence models (the GPT's data): random windows of seq + 1 tokens, x the
 * first seq and y the next seq (B, seq) I32. vocab 0: path's bytes (vocabulary 256; NULL path:
 * a licence text of the system); vocab N: path is a token file (nanoGPT's raw uint16, or an
 * llm.c shard, detected by its header), every token below N, checked on reading. val_path: a
 * separate validation file (NULL: 10% of path held out). Bad files are refused naming the
 * file and the byte offset. */
sg_status sg_dataset_from_text(sg_ctx *ctx, const char *path, const char *val_path, int64_t vocab,
                               int64_t seq, sg_dataset **out);
/* Batches from your own loader on the host: the data set holds two batches (x_shape and
 * y_shape are a batch's, first dim the batch) in device slots; sg_dataset_feed copies batch
 * `index` into slot index mod 2 through pinned memory, queued on a copy stream, so that it
 * overlaps the step that reads the other slot. Feed batch i before the step of batch i and,
 * for overlap, after queuing step i-1. Not with steps_per_call > 1. */
sg_status sg_dataset_create_fed(sg_ctx *ctx, sg_dtype x_dtype, int x_ndim, const int64_t *x_shape,
                                sg_dtype y_dtype, int y_ndim, const int64_t *y_shape,
                                sg_dataset **out);
sg_status sg_dataset_feed(sg_dataset *d, int64_t index, const void *x, size_t x_bytes,
                          const void *y, size_t y_bytes);
/* Gives a data set of samples (sg_dataset_create, sg_dataset_from_npy, not yet handed to a
 * model) a validation split: x (n_val, ...) and y (n_val, ...), samples shaped and typed as
 * d's, made on d's context, taken whatever it returns. sg_trainer_eval reads it as split 1,
 * batch i holding samples (i*B + r) mod n_val; training never does. */
sg_status sg_dataset_set_validation(sg_dataset *d, sg_tensor *x, sg_tensor *y);
/* A data set not handed to a model. */
void sg_dataset_destroy(sg_dataset *d);
int64_t sg_dataset_samples(const sg_dataset *d);

/* Host work of the CPU backend (your module's CPU reference): sg_cpu_run calls fn(ctx, args)
 * now, or, while a graph is captured, records it with a copy of args (size bytes) into the
 * plan that replays run, as the library's own CPU ops do. Read inputs and write outputs
 * through pointers in args (tensor data stays where it is). CPU backend only. */
typedef sg_status (*sg_cpu_thunk)(sg_ctx *ctx, const void *args);
sg_status sg_cpu_run(sg_ctx *ctx, sg_cpu_thunk fn, const void *args, size_t size);
/* The queue a module's kernels go on: a cudaStream_t on the CUDA backend, NULL on the CPU. */
void *sg_ctx_stream(const sg_ctx *ctx);
/* Runs the next passes on the first `rows` rows of t's storage (rows <= those it was made with). */
sg_status sg_tensor_set_rows(sg_tensor *t, int64_t rows);

/* ---- training under a capture scope ------------------------------------------------------ */

typedef enum sg_scope {
    SG_SCOPE_EAGER = 0,  /* nothing captured */
    SG_SCOPE_LAYER,      /* each chosen module's forward and backward: two graphs apiece */
    SG_SCOPE_MODEL,      /* the whole model's forward, and its backward: two graphs */
    SG_SCOPE_STEP        /* forward + loss + backward + optimizer: one graph */
} sg_scope;

typedef enum sg_capture_fail {
    SG_CAPTURE_FAIL_ERROR = 0,  /* a failed capture fails the step */
    SG_CAPTURE_FAIL_EAGER       /* run that region eagerly from then on, and say why (stats) */
} sg_capture_fail;

typedef struct sg_trainer sg_trainer;

typedef struct sg_trainer_options {
    sg_scope scope;
    const char *graph_modules;  /* layer scope: comma-separated module names or indices; NULL: all */
    int warmup;                 /* eager steps before capture (default 3) */
    sg_capture_fail on_capture_fail;
    /* Variable batch (eager and step scopes): sorted bucket sizes, the largest at most the
     * model's batch. A step of n rows runs padded up to its bucket, the padding masked out of
     * the loss; under step scope each bucket has its own graph in a cache of graphs that share
     * one pool, evicted least-recently-used above cache_budget bytes (0: no limit). */
    const int64_t *batch_buckets;
    int n_buckets;
    /* Variable sequence length (gpt models; eager and step scopes): sorted sequence lengths,
     * the largest at most the model's T. A step of len tokens a row (sg_trainer_step_seq) runs
     * at the smallest length Tb >= len: M = B*Tb rows, attention (B, H, Tb, Tb), positions
     * len..Tb-1 of every row padded (token 0, target -1: masked out of the loss). Attention is
     * causal and the padding comes last, so the real positions compute what a length-len
     * sequence computes. Under step scope each length has its own graph in the cache below.
     * Not with batch_buckets. */
    const int64_t *seq_buckets;
    int n_seq_buckets;
    size_t cache_budget;
    /* Optimizer steps per sg_trainer_step call (default 1). Under step scope the graph holds
     * that many consecutive steps, so one launch serves them all and the host cost per step
     * falls by that factor; the loss read afterwards is the last step's. */
    int steps_per_call;
    /* Gradient accumulation: micro-batches per optimizer step, 1 (the default) to 1024; 0 and
     * others are refused (SG_ERR_INVALID). Optimizer step i trains on batches i*accum ..
     * i*accum + accum-1 of the model's batch size B, each a forward, loss and backward whose
     * loss gradient is scaled by 1/accum; their gradients are summed in f32 in micro-batch
     * order (mixed precision: the scaled bf16 gradients summed into the f32 ones, unscaled
     * once; a step is skipped when the sum is not finite, that is when any micro-batch's
     * gradients were not; the loss scale moves once per step), so the step's gradient is that
     * of one batch of accum*B rows with the mean loss, within f32 rounding. Clipping, the
     * optimizer and (with dist) the all-reduce of the sum run once, after the last
     * micro-batch. Dropout draws fresh masks each micro-batch. The loss the model holds after
     * a step (sg_model_loss) is the mean of its micro-batches' losses, summed on the device
     * (no host sync). Under step scope the graph holds every micro-batch, unrolled (steps_per_call
     * steps of accum micro-batches each); under model scope the forward and backward graphs
     * replay accum times a step. fp32 models get one more gradient-sized f32 buffer. Not with
     * batch or sequence buckets, nor with a fed data set. Checkpoints record accum (when not 1),
     * and sg_trainer_load resumes at the saving run's next batch (see there). */
    int accum;
    /* Clip gradients to this global norm inside the step (0: no clipping): the norm measured
     * and the update multiplying the gradients by the factor as it reads them (sg_clip_factor;
     * bit for bit sg_clip_grad_norm first, one pass fewer; under mixed precision with accum 1
     * the norm of the bf16 gradients times 1 / scale, sg_clip_sumsq_amp, and the update
     * unscaling them too, no f32 gradients written; STEPGRAPH_CLIP=separate unscales and scales
     * them first). */
    float clip;
    /* ---- control flow on the device (conditional graph nodes; see sg_graph_if). Each form
     * computes what the eager step computes, bit for bit; it changes only how a captured
     * graph is built. Where capture cannot make conditional nodes (sg_graph_conditionals, or
     * STEPGRAPH_DISABLE_CONDITIONALS=1) the trainer builds the graph without them and says so
     * in sg_trainer_stats.cond_note. ---- */
    /* Under step scope, repeated work as a WHILE node with a device counter instead of
     * unrolled copies: the accum micro-batches (the first and last unrolled, the accum - 2
     * between them one loop body) and the steps_per_call steps (one loop body; with dist the
     * steps stay unrolled: a step's all-reduce cannot sit in a loop body). 0 (the default):
     * unrolled. H100, gpt-256-4-8-128: 4-7% faster at accum 4, 1% slower at 16, instantiated
     * 5-6x faster there (bench/RESULTS.md, session 23). */
    int loop;
    /* Mixed precision under step scope: the optimizer's update inside an IF node that runs it
     * only when the step's gradients were finite (the unscale's flag), instead of update
     * kernels that launch and return on the flag. Clipping stays outside, as eagerly. 0 (the
     * default): predicated, which measured 1.3% faster on gpt-256-4-8-128 bf16. */
    int skip_if;
    /* With seq_buckets: sg_trainer_step draws each step's length on its own, sg_vary_len(step,
     * the largest bucket), as sg_trainer_step_seq(t, step, that length) would run it, and
     * steps_per_call may exceed 1. Under step scope the data gather draws the length on the
     * device and one step graph holds every bucket as a branch of a SWITCH node on it: one
     * launch runs steps_per_call steps of different lengths (branches share their buffers).
     * Buckets whose graph has not run get one forward and backward, their results dropped,
     * before the capture (their lazy set-up; the training is unchanged). */
    int vary_seq;
    /* The same with batch_buckets (models of samples): each step's rows drawn by
     * sg_vary_len(step, the largest bucket), as sg_trainer_step_rows would run them; under step
     * scope the padding is written on the device after the gather and a SWITCH holds every
     * batch bucket's step. */
    int vary_batch;
    /* Early stop (with steps_per_call steps a call): stop when a step's loss was not finite
     * for stop_nonfinite steps in a row (0: never), or when it is <= stop_loss (stop_on_loss
     * nonzero). Under step scope the call's steps are a WHILE node whose condition a kernel
     * after each step writes; other scopes read the flag after each step (a host sync). Once
     * stopped, later calls run no step. sg_trainer_get_stop says how many steps ran. */
    int stop_nonfinite;
    int stop_on_loss;
    float stop_loss;
    /* Data parallelism (NULL: none): gradients are averaged over the ranks of dist inside the
     * step, in buckets overlapping the backward pass; the model must be built with shard =
     * its rank and shards = its world size. Captured scopes run at least SG_DIST_MIN_WARMUP
     * eager steps first. Not with batch or sequence buckets. dist must outlive the trainer. */
    struct sg_dist *dist;
    /* With dist: a sharded optimizer (ZeRO stage 1). Each bucket of gradients is
     * reduce-scattered instead of all-reduced, each rank keeps the optimizer state and f32
     * masters of its share of every bucket only (1/world of them) and updates them, and the
     * updated parameters (bf16 copies under mixed precision) are all-gathered after the
     * update (with accum > 1 the step's f32 sums are reduce-scattered after the last
     * micro-batch). With clip the global norm is summed over the ranks' shares (in f64: the
     * unsharded norm up to the order of that sum, within an f32 ulp; sg_clip_sumsq,
     * sg_clip_apply). With STEPGRAPH_SHARD_GATHER=ahead or STEPGRAPH_NCCL_CE=1 (experimental:
     * the bf16 weights in NCCL windows, gathered on the copy engines) each step gathers the
     * last update's shares ahead of its forward instead, and between steps the model's
     * weights are whole only after sg_trainer_gather_params, a save, sg_trainer_eval or
     * sg_trainer_destroy (collectives: every rank calls them). The optimizer must not have
     * stepped yet; its state
     * then holds this rank's shares (sg_trainer_save gathers them: every rank calls it, rank 0
     * writes). Under mixed precision the model's f32 parameters (sg_model_params) are whole
     * only after sg_trainer_gather_params or a save; the bf16 copies the steps read always are.
     * The optimizer then belongs to this trainer: destroying the trainer frees its state, and
     * the optimizer refuses any later use with an error saying so. */
    int shard_optimizer;
} sg_trainer_options;

typedef struct sg_trainer_stats {
    sg_scope scope;
    int graphs;                 /* graphs captured and held */
    int nodes;                  /* their nodes, summed */
    uint64_t replays;
    double capture_ms, instantiate_ms;  /* summed over graphs */
    size_t exec_bytes;
    int fell_back;              /* on_capture_fail = eager took over */
    sg_graph_cache_stats cache; /* variable batch or sequence length under step scope */
    char fallback_reason[512];
    /* A form of sg_trainer_options (loop, skip_if, vary_seq, early stop) that was asked for
     * but built without conditional nodes, and why ("" when none). */
    char cond_note[512];
    /* Memory, in bytes of whole allocator blocks (as sg_alloc_stats counts them). The static
     * buffers, allocated when the model, optimizer and trainer were built, and never again: */
    size_t param_bytes;         /* parameters: f32 masters (+ bf16 copies), segment tables */
    size_t grad_bytes;          /* gradients: f32 (+ bf16 in mixed precision; + accum > 1's
                                 * f32 sum in fp32) */
    size_t optim_bytes;         /* optimizer state: moments and device hyperparameters */
    size_t data_bytes;          /* the data set held on the device */
    size_t activation_bytes;    /* the rest of the model: activations and their gradients,
                                 * workspaces, static inputs, loss, scaler */
    sg_alloc_stats graph_pool;  /* the pool the trainer's graphs share (zeros without graphs):
                                 * what capture needed beyond the static buffers */
    /* One optimizer step's work (sg_ctx_work), counted over the first eager call (the warm-up's,
     * under a captured scope), per step of the call; work_counted 0 until one ran. */
    sg_work work;
    int work_counted;
} sg_trainer_stats;

sg_trainer_options sg_trainer_options_default(void);
const char *sg_scope_name(sg_scope s);
/* "eager", "layer", "model" or "step". */
sg_status sg_scope_parse(const char *s, sg_scope *out);
/* Trains m with o under opts->scope. Captured scopes give the model static inputs (each step
 * copies its batch in). STEPGRAPH_DISABLE_GRAPHS=1 runs every scope eagerly. */
sg_status sg_trainer_create(sg_model *m, sg_optim *o, const sg_trainer_options *opts,
                            sg_trainer **out);
/* A sharded optimizer's trainer gathering ahead of the forward (shard_optimizer with
 * STEPGRAPH_SHARD_GATHER=ahead or STEPGRAPH_NCCL_CE=1) first gathers the parameters that steps
 * updated into the model, which outlives it whole: a collective, so every rank destroys its
 * trainer (skipped when the run has failed). */
void sg_trainer_destroy(sg_trainer *t);
/* One optimizer step, number `index` (steps_per_call steps: index, index+1, ...), on batches
 * index*accum .. index*accum + accum-1 (accum 1: batch `index`): the first `warmup` calls run
 * eagerly, the next captures, later ones replay. `index` counts optimizer steps, as
 * checkpoints do: resuming at step s trains on batch s*accum next. SG_ERR_INVALID for a
 * negative index, or one whose batches overflow int64. */
sg_status sg_trainer_step(sg_trainer *t, int64_t index);
/* The same with only the first `rows` rows of the batch (variable batch: needs buckets). */
sg_status sg_trainer_step_rows(sg_trainer *t, int64_t index, int64_t rows);
/* One step whose B rows are windows of `len` real tokens (variable sequence length: needs
 * seq_buckets; len from 1 to the largest), run padded up to its bucket. Batch `index` holds
 * the windows a batch of length len would: the same bytes whatever the bucket. Under step
 * scope a bucket's first step after the trainer's warm-up runs eagerly (its graph's warm-up),
 * its second captures the bucket's graph, later ones replay it. SG_ERR_SHAPE for a len outside
 * 1..the largest bucket, SG_ERR_INVALID without seq_buckets. */
sg_status sg_trainer_step_seq(sg_trainer *t, int64_t index, int64_t len);
/* The sequence length (or row count) of step `step` of a varying run: 1 + a splitmix64 hash of
 * step, modulo max; uniform over 1..max (max >= 1; 0 for max < 1). The CLI's --vary-seq and
 * --vary-batch draw their lengths with it, and sg_trainer_options.vary_seq draws them on the
 * device the same way. */
int64_t sg_vary_len(int64_t step, int64_t max);
sg_status sg_trainer_get_stats(const sg_trainer *t, sg_trainer_stats *out);
/* Early stop (sg_trainer_options.stop_nonfinite, stop_on_loss): what the device counted. */
typedef enum sg_stop_reason { SG_STOPPED_NO = 0, SG_STOPPED_NONFINITE, SG_STOPPED_LOSS } sg_stop_reason;
typedef struct sg_trainer_stop {
    int64_t steps_run;          /* optimizer steps run since the trainer was made */
    int last_call_steps;        /* steps the last sg_trainer_step call ran */
    sg_stop_reason stopped;     /* why the run stopped, if it did */
} sg_trainer_stop;
/* A host sync. Without an early-stop rule: the steps counted on the host, never stopped. */
sg_status sg_trainer_get_stop(sg_trainer *t, sg_trainer_stop *out);
/* The loss scaler's state (scale, steps skipped for non-finite gradients...): a host sync.
 * fp32 models hold one too, unused (scale 65536, nothing skipped). */
sg_status sg_trainer_get_scaler(sg_trainer *t, sg_loss_scaler *out);
/* Sets the loss scaler's state (queued on the stream; the host struct may be reused at once):
 * scale > 0 (+inf included: the next step's gradients overflow, it is skipped and the scale
 * backs off to SG_LOSS_SCALE_MAX: tests and benchmarks of the skip force an overflow so),
 * growth_interval >= 1, good_steps and skipped >= 0. SG_ERR_INVALID naming the field else,
 * and for a scale other than 1 on a model without loss scaling (SG_LOSS_SCALING_NONE). */
sg_status sg_trainer_set_scaler(sg_trainer *t, const sg_loss_scaler *in);
/* Mean loss over n_batches batches of a split (0 train, 1 validation: gpt models hold one out,
 * image models trained on a digits file too), forward only, eagerly, dropout off; a host sync.
 * With data parallelism every rank calls it (the mean is over the ranks' rows; a sharded
 * optimizer's parameters are gathered first). */
sg_status sg_trainer_eval(sg_trainer *t, int split, int n_batches, float *out);
/* The size of split 0 (train) or 1 (validation) of the model's data: tokens for token text,
 * samples otherwise; 0 where there is no such split (sg_trainer_eval refuses it). */
int64_t sg_model_split_size(const sg_model *m, int split);
/* The largest step a checkpoint holds, 2^53: a double counts every step up to it exactly,
 * and a caller adding a run's step count to it cannot overflow int64_t. */
#define SG_TRAINER_MAX_STEP ((int64_t)1 << 53)
/* Checks a checkpoint target before a run starts, so that a bad path fails in a second, not
 * after hours of training: path not empty (SG_ERR_INVALID); its directory exists, is a
 * directory, writable and searchable; the target absent or a regular file, never a device
 * (/dev/null), FIFO, directory or socket, which the save's rename would replace (SG_ERR_IO,
 * naming the path and what is wrong). A symbolic link is written through: the save replaces
 * the file the link names (with a temporary beside that file) and the link stays a link; a
 * dangling link is refused. Saving applies the same check again; it also keeps an existing
 * file's permission bits (its owner too when run as root), and removes "<file>.tmp.<pid>"
 * temporaries that saves killed midway left, once their process is gone. */
sg_status sg_checkpoint_check_path(sg_ctx *ctx, const char *path);
/* A sharded optimizer's run (shard_optimizer): the model's parameters (the f32 masters, and the
 * bf16 copies under mixed precision) made whole on every rank from each rank's shares (a
 * collective: every rank calls it, between steps). SG_OK and nothing done otherwise. */
sg_status sg_trainer_gather_params(sg_trainer *t);
/* A checkpoint in the safetensors format: every parameter by name, the optimizer's state
 * (moments, hyperparameters and step count), the dropout generator, and in the metadata
 * "format" "stepgraph-1", "model", "step" (0 to SG_TRAINER_MAX_STEP, else SG_ERR_INVALID) and
 * "precision" (sg_dtype_name: "f32" or "bf16"); written to a temporary file, flushed and
 * renamed, as sg_checkpoint_check_path describes. A tensor holding NaN or Inf is refused
 * (SG_ERR_INVALID, naming it) and nothing is written: a non-finite checkpoint never is.
 * A sharded optimizer's save is a collective: every rank gathers, rank 0 writes, and every
 * rank returns only once the file is complete, with an error (SG_ERR_IO on the others) when
 * rank 0 could not write it; when a rank cannot allocate the gathered state, every rank fails
 * at once (SG_ERR_OOM on the others), before any gather, and nothing is written. */
sg_status sg_trainer_save(sg_trainer *t, int64_t step, const char *path);
/* Loads such a checkpoint into the trainer's model and optimizer; *step: the next step, in this
 * trainer's optimizer steps: a checkpoint saved at step s by a trainer of accum a (metadata
 * "accum", written when not 1; absent: 1) was to train on batch s*a next, and *step is
 * s*a / accum, the step that starts there (SG_ERR_INVALID, naming both, when accum does not
 * divide s*a).
 * Everything is validated before anything changes: names, shapes and dtypes; every floating
 * value finite (NaN or Inf refused naming the tensor and the element); the metadata "format"
 * exactly "stepgraph-1", "model" this model's name, "precision" "f32" or "bf16" (either
 * resumes in either: the master weights are f32), and "step" decimal digits only (no sign,
 * space, fraction or leading zero) from 0 to SG_TRAINER_MAX_STEP. A file that is not a
 * regular file (a FIFO, a device) is refused without blocking. SG_ERR_INVALID (naming the
 * file, the key and the value) or the errors of a load; the trainer is then unchanged. */
sg_status sg_trainer_load(sg_trainer *t, const char *path, int64_t *step);
/* The model's logits of the last forward, (M, classes) on the device. */
const sg_tensor *sg_model_logits(const sg_model *m);
/* The model's token input (gpt: (B, T) I32), for callers that fill it themselves (sampling). */
sg_tensor *sg_model_input(sg_model *m);

/* ---- generation: a GPT's KV-cache decoding, eager, a graph a step, or one graph ------------ *
 *
 * A generator reads a GPT's parameters by name (wte.weight, wpe.weight, blocks.L.*, ln_f.*,
 * head.weight: any model built from sg_module_embedding, sg_module_gpt_block, a LayerNorm
 * "ln_f" and a bias-free Linear "head", as the built-in gpt kind is) where the model keeps
 * them (the bf16 compute copies under mixed precision), so it sees every optimizer step and
 * checkpoint load. It owns a key/value cache of max_batch x max_len positions per layer in the
 * model's precision and the buffers of a forward of max_batch x max_len rows.
 *
 * sg_generate runs a batch of prompts of different lengths: a prefill over the prompts padded
 * to a bucket of lengths (powers of two), which writes the cache and draws each sequence's
 * first new token from its last prompt position; then decode steps, one new token for every
 * running sequence, each attending to its cache. Sampling runs on the device (decode.h:
 * greedy, temperature, top-k, a counter-based generator keyed by (seed, sequence, token
 * number), so every mode draws the same tokens for a seed); a sequence finishes at its
 * max_new tokens or when its new tokens end with the stop sequence; finished sequences are
 * masked, and the batch stops when none runs. Modes:
 *   SG_GEN_EAGER  every kernel launched from the host; the host reads a flag after each step;
 *   SG_GEN_STEP   the prefill and the decode step each a captured graph, per batch bucket (as
 *                 inference engines capture one decode graph per batch size), replayed once a
 *                 token; the host reads the flag after each replay;
 *   SG_GEN_LOOP   the whole generation one graph per (batch, prompt) bucket: the prefill, then
 *                 a WHILE conditional node running decode steps until no sequence runs. One
 *                 launch; the host reads the results once. Needs conditional nodes (CUDA 12.4;
 *                 every CPU build); where capture cannot make them, sg_generate fails with
 *                 SG_ERR_UNSUPPORTED naming why, and STEP is the mode to use.
 * Greedy decoding gives the same tokens in every mode, bit for bit on one backend. */
typedef enum sg_gen_mode { SG_GEN_EAGER = 0, SG_GEN_STEP, SG_GEN_LOOP } sg_gen_mode;
const char *sg_gen_mode_name(sg_gen_mode m);       /* "eager", "step", "loop" */
sg_status sg_gen_mode_parse(const char *s, sg_gen_mode *out);

typedef struct sg_generator sg_generator;

typedef struct sg_generator_options {
    int max_batch;             /* sequences a call takes (default 1) */
    int64_t max_len;           /* positions a sequence holds, prompt and new tokens (0: the
                                * model's sequence length, which is also the most it takes:
                                * the position embedding has that many rows) */
    int heads;                 /* attention heads (0: width / 64, the gpt kind's) */
    const int64_t *batch_buckets;  /* sorted batch sizes graphs are captured for (NULL: 1, 2, 4,
                                    * ... up to max_batch, and max_batch) */
    int n_batch_buckets;
} sg_generator_options;

sg_generator_options sg_generator_options_default(void);

/* Checks that m is a GPT as above (SG_ERR_INVALID naming the missing or misshapen parameter)
 * and allocates the cache and buffers (SG_ERR_OOM naming the bytes). m must outlive it. */
sg_status sg_generator_create(sg_model *m, const sg_generator_options *opts, sg_generator **out);
void sg_generator_destroy(sg_generator *g);

#define SG_GEN_MAX_STOP_TOKENS 16

typedef struct sg_generate_request {
    int n;                             /* sequences, 1..max_batch */
    const int32_t *const *prompts;     /* n prompts of prompt_lens[i] >= 1 tokens each */
    const int64_t *prompt_lens;
    int64_t max_new;                   /* new tokens per sequence, >= 1; prompt_lens[i] + max_new
                                        * <= max_len */
    const int64_t *max_new_each;       /* NULL, or each sequence's own (1..max_new) */
    float temperature;                 /* 0: greedy (the largest logit, the lowest token on a tie) */
    int top_k;                         /* 0: every token; else the k likeliest (ties kept) */
    uint64_t seed;                     /* the sampler's key */
    const int32_t *stop;               /* a stop sequence (NULL: none): a sequence finishes once */
    int n_stop;                        /* its new tokens end with it (1..SG_GEN_MAX_STOP_TOKENS) */
    sg_gen_mode mode;
} sg_generate_request;

/* Why a sequence finished. */
typedef enum sg_gen_finish { SG_GEN_FINISH_LENGTH = 1, SG_GEN_FINISH_STOP = 2 } sg_gen_finish;

typedef struct sg_generate_stats {
    double wall_ms;            /* the call, from its first copy to its results on the host */
    double host_us;            /* host time spent queuing work (the launches, the eager calls;
                                * the flag reads of eager and step modes excluded) */
    int64_t steps;             /* decode steps run (the prefill not counted) */
    int64_t tokens;            /* new tokens across the sequences */
    int64_t batch_bucket, prompt_bucket;
    int captured;              /* graphs captured by this call (0: all were cached) */
    double capture_ms;         /* their capture and instantiation */
    int graphs;                /* graphs the generator holds */
    int nodes;                 /* nodes of the graphs this call replayed */
} sg_generate_stats;

/* Generates r->n sequences. tokens: n x max_new int32, sequence i's new tokens in row i;
 * lens[i]: how many (the rest of the row is -1); finish (NULL or n): why each stopped; stats
 * NULL or filled. Every argument is checked first (SG_ERR_INVALID naming it); a failure
 * leaves the generator usable. The cache and the state are the generator's: calls run one at
 * a time. */
sg_status sg_generate(sg_generator *g, const sg_generate_request *r, int32_t *tokens, int64_t *lens,
                      sg_gen_finish *finish, sg_generate_stats *stats);

/* ---- data parallelism: one process per GPU, gradients averaged over NCCL ------------------ *
 *
 * Each process (rank) builds the same model with shard = rank, shards = world, joins the run
 * with sg_dist_create, and trains with sg_trainer_options.dist set: every rank then holds the
 * parameters one process training on the whole batch would. `stepgraph train --gpus N` starts
 * the N processes (sg_dist_launch) and hands each its rank and the run's id. */

typedef struct sg_dist sg_dist;

/* What every rank of a run shares to find the others: NCCL's ncclUniqueId (128 bytes: rank 0's
 * address) on CUDA; on the CPU backend, whose collectives run over local sockets as the
 * reference that lets machines without GPUs test data parallelism, a local socket name. */
#define SG_DIST_ID_BYTES 128
typedef struct sg_dist_id {
    unsigned char bytes[SG_DIST_ID_BYTES];
} sg_dist_id;

#define SG_DIST_MAX_WORLD 1024
#define SG_DIST_MIN_WARMUP 2  /* eager steps before a capture: NCCL connects during them */

typedef struct sg_dist_options {
    int rank, world;            /* this process is rank 0..world-1 */
    sg_dist_id id;              /* the same on every rank (sg_dist_id_create, on one of them) */
    size_t bucket_bytes;        /* gradient bytes a bucket gathers before its all-reduce (0: 4 MiB) */
    double timeout_s;           /* the longest wait for peers: connecting, a collective, a check (0: 300) */
} sg_dist_options;

sg_dist_options sg_dist_options_default(void);
/* A fresh id for ranks on backend b: ncclGetUniqueId for SG_BACKEND_CUDA (SG_ERR_UNSUPPORTED
 * in a build without NCCL), a new local socket name for SG_BACKEND_CPU. On CUDA the calling
 * process answers NCCL's bootstrap until every rank has connected: it must outlive set-up. */
sg_status sg_dist_id_create(sg_backend b, sg_dist_id *out);
/* The id as 256 lowercase hex digits and a NUL; and back (SG_ERR_INVALID for anything else). */
void sg_dist_id_to_hex(const sg_dist_id *id, char out[2 * SG_DIST_ID_BYTES + 1]);
sg_status sg_dist_id_from_hex(const char *hex, sg_dist_id *out);

/* Joins the run as opts->rank of opts->world on ctx's device: NCCL over ctx's GPU (a
 * communicator, a second stream for collectives, and a watchdog thread that aborts the
 * communicator when NCCL reports an error or queued steps make no progress for timeout_s),
 * or local sockets on the CPU. Waits for every rank, at most timeout_s: SG_ERR_DIST (message
 * in sg_ctx_last_error(ctx)) when they do not all arrive. */
sg_status sg_dist_create(sg_ctx *ctx, const sg_dist_options *opts, sg_dist **out);
/* Leaves the run (aborting the communicator if a peer failed). Destroy trainers first. */
void sg_dist_destroy(sg_dist *d);
int sg_dist_rank(const sg_dist *d);
int sg_dist_world(const sg_dist *d);
/* SG_OK while the run is healthy; once a peer failed, a collective timed out or the ranks
 * disagreed, SG_ERR_DIST with the reason, from then on (the communicator is aborted, so no
 * rank hangs). Cheap; no host sync. */
sg_status sg_dist_poll(sg_dist *d);
/* Averages n (1 to 512) host values over the ranks (every rank calls it; a host sync): an
 * evaluation loss. */
sg_status sg_dist_average_host(sg_dist *d, double *v, int n);

typedef struct sg_dist_stats {
    uint64_t collectives;       /* queued from the host so far (a replay runs its own, unseen) */
    uint64_t bytes;             /* their payload */
    int buckets_per_step;       /* gradient all-reduces in the last backward */
    uint64_t bytes_per_step;    /* the payload of the last backward's collectives (the loss too) */
    int checks;                 /* captures whose collectives every rank compared */
} sg_dist_stats;
sg_status sg_dist_get_stats(const sg_dist *d, sg_dist_stats *out);

/* ---- launching ranks: one process per GPU, on one host or several ---- */

/* A worker's place in the run, from the environment sg_dist_launch gives it: SG_DIST_RANK,
 * SG_DIST_WORLD, SG_DIST_LOCAL_RANK (its GPU), SG_DIST_LOCAL_WORLD and SG_DIST_ID (hex). */
typedef struct sg_dist_env {
    int rank, world, local_rank, local_world;
    sg_dist_id id;
} sg_dist_env;

/* *found = 1 and *out filled when SG_DIST_RANK is set, 0 when it is not; SG_ERR_INVALID
 * (sg_ctx_last_error(NULL) names the variable) when the variables are partial or malformed. */
sg_status sg_dist_env_read(sg_dist_env *out, int *found);

typedef struct sg_dist_launch_options {
    int local_world;            /* workers on this host, one per GPU (--gpus N) */
    int nnodes, node_rank;      /* hosts in the run (1) and this one's index (0) */
    const char *master;         /* "ADDR:PORT" node 0 listens on, for nnodes > 1 */
    sg_dist_id id;              /* node 0: the run's id (other nodes receive node 0's) */
    double timeout_s;           /* the longest wait for the other hosts (0: 60) */
    double grace_s;             /* after a failure: SIGTERM, then SIGKILL after this (0: 5) */
    char *const *argv;          /* a worker's command line, NULL-terminated; argv[0]: its program */
} sg_dist_launch_options;

typedef struct sg_dist_launch_result {
    int failed_rank;            /* the first rank that failed (-1: none, or a whole host was lost) */
    int exit_status;            /* its exit status, or 128 + the signal that ended it */
    int failed_node;            /* the host it ran on (-1: none) */
    int interrupted_by;         /* SIGINT or SIGTERM to this launcher stopped the run; else 0 */
} sg_dist_launch_result;

/* Runs local_world workers of argv on this host, as ranks node_rank*local_world + i (i: the
 * worker's GPU), each with the SG_DIST_* variables set, and waits for them all. When one exits
 * with a non-zero status or is killed, the others (on every host) get SIGTERM, then SIGKILL
 * after grace_s, and the call fails with SG_ERR_DIST naming the rank and how it ended
 * (sg_ctx_last_error(NULL)); res (may be NULL) says the same. With nnodes > 1 the hosts first
 * exchange node 0's id over TCP (sg_dist_exchange_id) and keep that connection to stop each
 * other's workers on a failure. Only processes it started are signalled. Workers end with the
 * launcher however it ends (a parent-death signal); SIGINT or SIGTERM to it stops them the same
 * way (a second signal: SIGKILL at once) and fails naming the signal, res->interrupted_by set,
 * exit_status 128 + it. */
sg_status sg_dist_launch(const sg_dist_launch_options *o, sg_dist_launch_result *res);

/* The id exchange on its own: node 0 listens on master ("ADDR:PORT"), accepts the nnodes-1
 * others, checks that their node ranks are distinct and their local_world is its own, and
 * sends each *id; the others connect (retrying while refused) and receive it into *id. At
 * most timeout_s in all: SG_ERR_DIST naming the address and what went wrong (a name that does
 * not resolve, refused connections, no answer, nodes missing, a mismatch); SG_ERR_INVALID for
 * a malformed address. */
sg_status sg_dist_exchange_id(const char *master, int nnodes, int node_rank, int local_world,
                              double timeout_s, sg_dist_id *id);

/* ---- JSON: one small streaming writer ------------------------------------------------------ *
 *
 * The library writes all its JSON through it (checkpoint headers, traces, the command's --json
 * and --metrics output); programs on the library can too:
 *
 *     sg_json *w;
 *     sg_json_create_file(stdout, SG_JSON_SPACED, &w);
 *     sg_json_object_begin(w);
 *     sg_json_key(w, "model");  sg_json_string(w, sg_model_name(m));
 *     sg_json_key(w, "ms");     sg_json_double(w, ms);          // NaN or inf: null
 *     sg_json_object_end(w);
 *     if (sg_json_finish(w) != SG_OK) puts(sg_json_error(w));  // {"model": "...", "ms": 0.25}
 *     sg_json_destroy(w);
 *
 * Strings are escaped fully: quote, backslash, \b \f \n \r \t, every other control character
 * as \u00xx; valid UTF-8 is written as it is and every other byte as \ufffd, so any bytes give
 * valid JSON. Numbers: integers exactly; doubles as the shortest text that reads back as the
 * same double, or with fixed decimals; NaN and infinities as null. The structure is checked as
 * it is written: a key only inside an object, a value after each key, ends that match their
 * begins, one value a document. The first error (SG_ERR_INVALID for misuse, SG_ERR_IO for a
 * failed write, SG_ERR_OOM) sticks: later calls write nothing and return it. */

typedef struct sg_json sg_json;

typedef enum sg_json_style {
    SG_JSON_COMPACT = 0,  /* {"a":1,"b":[true,null]} */
    SG_JSON_SPACED        /* {"a": 1, "b": [true, null]}: one line, a space after ':' and ',' */
} sg_json_style;

#define SG_JSON_MAX_DEPTH 64

/* A writer into f (which stays the caller's to close), or into a growing buffer. */
sg_status sg_json_create_file(FILE *f, sg_json_style style, sg_json **out);
sg_status sg_json_create_buffer(sg_json_style style, sg_json **out);
void sg_json_destroy(sg_json *w);
/* SG_OK when one whole value was written without error; else the first error, or
 * SG_ERR_INVALID when a container is still open or nothing was written. Writes a pending line
 * break (sg_json_newline). */
sg_status sg_json_finish(sg_json *w);
/* The first error (SG_OK: none) and its message ("" when none). */
sg_status sg_json_status(const sg_json *w);
const char *sg_json_error(const sg_json *w);
/* A buffer writer's text so far, NUL-terminated (*len: its length; len may be NULL); valid
 * until the next call on w. NULL for a file writer. */
const char *sg_json_text(const sg_json *w, size_t *len);

sg_status sg_json_object_begin(sg_json *w);
sg_status sg_json_object_end(sg_json *w);
sg_status sg_json_array_begin(sg_json *w);
sg_status sg_json_array_end(sg_json *w);
/* An object member's key; its value is the next value written. */
sg_status sg_json_key(sg_json *w, const char *key);
/* s NULL: null. */
sg_status sg_json_string(sg_json *w, const char *s);
sg_status sg_json_int(sg_json *w, int64_t v);
sg_status sg_json_uint(sg_json *w, uint64_t v);
/* The fewest digits that read back as v: "0.1", "3", "100", "1e-07", "1.5e+300". */
sg_status sg_json_double(sg_json *w, double v);
/* v with `decimals` (0 to 17) digits after the point ("%.*f"). */
sg_status sg_json_fixed(sg_json *w, double v, int decimals);
sg_status sg_json_bool(sg_json *w, int v);
sg_status sg_json_null(sg_json *w);
/* A line break before the next token (after its comma): one array element a line, for files
 * people read. Whitespace only: the document means the same. */
sg_status sg_json_newline(sg_json *w);
/* One JSON string on its own, escaped as above, into f (s NULL: null). */
sg_status sg_json_write_string(FILE *f, const char *s);

/* ---- profiler: what the GPU ran, and the calls that queued it ----------------------------- *
 *
 * A small profiler over CUPTI's activity API: it records every kernel, memcpy and memset the
 * GPU runs between sg_prof_start and sg_prof_stop, the CUDA runtime and driver calls that
 * queued them, and the context's named ranges ("step", "blocks.3.forward"); sums the device
 * work up (counts, GPU-busy time, span, short-kernel share), cuts a window into steps
 * (sg_prof_analyze) and writes a Perfetto trace (sg_prof_write_trace).
 *
 *     sg_prof *p;
 *     if (sg_prof_create(ctx, &p) != SG_OK) { puts(sg_ctx_last_error(ctx)); ... }
 *     sg_prof_start(p);
 *     for (...) run_step();
 *     sg_prof_result r;
 *     sg_prof_stop(p, &r);          // syncs the context, flushes CUPTI, fills r
 *     printf("%llu kernels, busy %.1f us of %.1f us\n", r.kernels, r.busy_us, r.span_us);
 *     sg_prof_destroy(p);
 *
 * CUPTI is process-global: it sees every kernel of the process (all contexts, all streams),
 * and only one sg_prof may exist at a time. On the CPU backend, or in a build without CUDA or
 * CUPTI, sg_prof_create fails with SG_ERR_UNSUPPORTED. Call a profiler's functions from one
 * thread, and destroy it before its context. */

typedef struct sg_prof sg_prof;

/* What one start/stop window saw. Times are microseconds of device time. */
typedef struct sg_prof_result {
    uint64_t kernels;            /* kernel executions (graph-replayed kernels count one each) */
    uint64_t memcpys;
    uint64_t memsets;
    double busy_us;              /* union of all activity intervals: time the GPU did anything */
    double span_us;              /* first activity's start to last activity's end */
    double kernel_us_sum;        /* sum of kernel durations (overlapping kernels count twice) */
    double short_kernel_share;   /* share of timed kernels shorter than SG_PROF_SHORT_KERNEL_US */
    uint64_t dropped;            /* records CUPTI dropped (no buffer space): then the numbers
                                  * above undercount; 0 in a sound run */
} sg_prof_result;

#define SG_PROF_SHORT_KERNEL_US 50.0

/* One recorded activity: device work (kernel, memcpy, memset), a host API call that queued
 * or waited for work (CUPTI's runtime and driver API records), or a named host range
 * (sg_range_push/pop: "step", "blocks.3.forward"). All on CUPTI's clock. */
typedef enum sg_prof_kind {
    SG_PROF_KIND_KERNEL = 0,
    SG_PROF_KIND_MEMCPY,
    SG_PROF_KIND_MEMSET,
    SG_PROF_KIND_API,            /* host: a CUDA runtime or driver call */
    SG_PROF_KIND_RANGE           /* host: a named range */
} sg_prof_kind;

/* What an API record's call does, for the analysis (launch overhead) and the trace. */
typedef enum sg_prof_api {
    SG_PROF_API_OTHER = 0,
    SG_PROF_API_LAUNCH,          /* a kernel launch (cudaLaunchKernel, cuLaunchKernel[Ex], ...) */
    SG_PROF_API_GRAPH_LAUNCH,    /* cudaGraphLaunch / cuGraphLaunch */
    SG_PROF_API_MEMCPY,          /* cudaMemcpy*Async and the like */
    SG_PROF_API_MEMSET,
    SG_PROF_API_SYNC             /* a host wait: stream, event or device synchronize */
} sg_prof_api;

typedef struct sg_prof_record {
    sg_prof_kind kind;
    uint32_t device_id;
    uint32_t stream_id;          /* device records */
    uint32_t correlation_id;     /* links device activity to the API call that queued it (a
                                  * graph's kernels share the cudaGraphLaunch's id) */
    uint64_t start_ns, end_ns;   /* CUPTI timestamps; both 0 when CUPTI could not time it */
    uint32_t graph_id;           /* device work run by a graph launch: the graph's id; else 0 */
    uint32_t thread_id;          /* API and range records: the host thread (gettid) */
    sg_prof_api api;             /* API records */
    int depth;                   /* range records: nesting depth, 0 outermost. API records:
                                  * 0, or 1 (2, ...) for a call made inside another call on the
                                  * same thread, i.e. its implementation (cudaLaunchKernel's own
                                  * cuLaunchKernel); launches count at depth 0 only */
    const char *name;            /* kernel name as CUPTI gives it (mangled), API function name
                                  * as CUPTI names it ("cudaLaunchKernel_v7000"), "memcpy HtoD",
                                  * "memset", or range name (owned by the profiler and valid
                                  * until it is destroyed, or static; may be NULL) */
} sg_prof_record;

/* Creates the process's profiler for ctx (a CUDA context). Registers the CUPTI buffer
 * callbacks; records nothing until sg_prof_start. Fails with SG_ERR_UNSUPPORTED on the CPU
 * backend or without CUPTI, and with SG_ERR_INVALID while another sg_prof exists. */
sg_status sg_prof_create(sg_ctx *ctx, sg_prof **out);
/* Stops recording if it is on (results discarded) and frees the profiler. */
void sg_prof_destroy(sg_prof *p);
/* Clears the previous window's records and enables kernel, memcpy, memset, runtime and driver
 * API activity, and records the context's named ranges (it sets ctx's range hook). */
sg_status sg_prof_start(sg_prof *p);
/* Waits for the context's stream, disables the activity kinds, flushes CUPTI's buffers, marks
 * calls made inside calls (their depth) and sums up the window into *out (may be NULL:
 * records only). A host sync. */
sg_status sg_prof_stop(sg_prof *p, sg_prof_result *out);
/* The last window's records, in delivery order (valid until the next start or destroy). */
const sg_prof_record *sg_prof_records(const sg_prof *p, size_t *n);

/* Device idle gaps by length, in microseconds: bin i holds gaps in [edge[i], edge[i+1]), the
 * last bin everything from its edge up. */
#define SG_PROF_GAP_BINS 8
extern const double sg_prof_gap_edges_us[SG_PROF_GAP_BINS]; /* 0, 1, 2, 5, 10, 20, 50, 100 */

/* One step, as the records of a window show it. Steps are the outermost "step" ranges (a "step"
 * inside another is not one), in time order. An API call belongs to the step whose range holds
 * its start; device work belongs to the step of the API call with its correlation id (device
 * work without one in any step, and calls outside every step, belong to none). Launches count
 * at depth 0 only. Device times are over the step's own device records. */
typedef struct sg_prof_step {
    double host_us;              /* the step range's length on the host */
    uint64_t kernels;            /* device kernels of the step (a graph's count one each) */
    uint64_t launch_calls;       /* kernel launch API calls (depth 0) */
    uint64_t graph_launches;     /* graph launch API calls */
    double launch_host_us;       /* host time inside launch and graph-launch calls */
    double device_us;            /* first device start to last device end of the step */
    double busy_us;              /* union of the step's device activity */
    double idle_us;              /* device_us - busy_us: gaps between the step's activity */
    double short_kernel_share;   /* share of timed kernels shorter than SG_PROF_SHORT_KERNEL_US */
    double launch_share;         /* launch_host_us / host_us: launch overhead's share */
    uint64_t gap_hist[SG_PROF_GAP_BINS];
} sg_prof_step;

/* Cuts records (in any order; a window's, or records of your own) into steps: fills up to
 * max_steps entries of steps (may be NULL when max_steps is 0), *n_steps the number found
 * (even when more than max_steps). Pure: no profiler or device needed. Returns SG_OK,
 * SG_ERR_NULL, or SG_ERR_OOM. */
sg_status sg_prof_analyze(const sg_prof_record *r, size_t n, sg_prof_step *steps, int max_steps,
                          int *n_steps);

/* Device time by op family, where the speed-of-light floor's families (sg_sol_floor) measure
 * their time. While a profiler records, each op's call leaves a range record of no length named
 * sg_prof_family_marker(its family) ("work:matmul", ...) before it queues anything. Each
 * kernel, copy and set is given the family of the last marker at or before the start of the API
 * call that queued it, on that call's thread and inside the same "step" range; out_us[
 * SG_WORK_FAMILIES] takes the rest: work queued outside every op (the batch copy-in) and work a
 * graph ran (its ops were called once, at capture), so profile eager steps to split a step by
 * family. Microseconds summed over the records (overlapping work counts twice). Pure: records
 * of your own work too. SG_ERR_NULL, SG_ERR_OOM. */
const char *sg_prof_family_marker(sg_work_family f);
sg_status sg_prof_family_us(const sg_prof_record *r, size_t n, double out_us[SG_WORK_FAMILIES + 1]);

/* Writes records as a Chrome trace-event JSON file ({"traceEvents": [...]}) that Perfetto and
 * chrome://tracing open: process 1 "host" with one track per thread (API calls, named ranges
 * nested by time), process 2 + device id "GPU n" with one track per stream (kernels, copies,
 * sets), times in microseconds from the first record, every span a complete event ("ph": "X")
 * with "ts", "dur", "pid", "tid" and "name", plus track-name metadata. "args" hold the
 * correlation id, the graph id of graph-launched work, an API call's class and depth, a
 * range's depth, and a kernel's mangled name where the shown name is shortened ("fill_kernel",
 * "cutlass::Kernel2<...>"). API names drop CUPTI's version suffix. Untimed records are left
 * out. Returns SG_ERR_IO (with a message on ctx, which may be NULL) when the file cannot be
 * written, leaving no partial file. */
sg_status sg_prof_write_trace(sg_ctx *ctx, const sg_prof_record *r, size_t n, const char *path);

/* ---- the capture advisor: what each scope buys a model, predicted, then measured ---------- *
 *
 * Before anything is captured, the advisor says what each scope (eager, layer, model, step)
 * will buy a model on this GPU: it calibrates the device's launch path, profiles eager steps
 * of the model, predicts each scope with a small explainable model (docs/advisor.md), then
 * (unless told not to) trains under each scope and measures it, beside the prediction:
 *
 *     sg_advise_result *r = malloc(sizeof *r);                  // ~25 KiB
 *     sg_advise_options o = sg_advise_options_default();
 *     if (sg_advise_name(ctx, "mlp-512-6-32", NULL, &o, r) == SG_OK)
 *         puts(r->verdict);   // "launch-bound: graphs pay (step scope predicted 1.78x; ..."
 *
 * Any model, a built-in one or your own: sg_advise(ctx, factory, user, &o, r), where the
 * factory builds it. The advisor profiles and measures on a CUDA context; the CPU backend has
 * no launches to time, and it fails there with SG_ERR_UNSUPPORTED. The prediction model itself
 * (sg_advise_predict, sg_advise_summarize) is pure arithmetic over the measured numbers below,
 * so it can be driven with numbers of your own. Times are microseconds unless a name says ms. */

/* eager, layer, model, step: the sg_scope values, in order. */
#define SG_ADVISE_SCOPES 4
/* Checklist thresholds: the share of the eager step that launches cost (see the summary). */
#define SG_ADVISE_SHARE_PAYS 0.15   /* above: launch-bound, graphs pay */
#define SG_ADVISE_SHARE_HELPS 0.05  /* above: partly launch-bound; at or below: GPU-bound */
#define SG_ADVISE_MAX_MODULES 64

/* This device's launch path, measured through the library's own calls. */
typedef struct sg_advise_calib {
    char device[320];
    /* Host. */
    double launch_host_us;       /* one eager launch: sg_tensor_fill of a 1-element tensor */
    double replay_base_us;       /* sg_graph_replay of an n-node graph: base + n * node */
    double replay_node_us;
    /* Device, timed on the wall clock with the stream kept full (a long kernel queued first),
     * the tiny kernel's own duration from CUPTI. NAN when CUPTI was not available. */
    double tiny_kernel_us;       /* device time of one tiny kernel (CUPTI) */
    double eager_kernel_us;      /* device time per back-to-back queued eager tiny kernel */
    double node_device_us;       /* device time per tiny kernel node of a graph */
    double eager_gap_us;         /* eager_kernel_us - tiny_kernel_us: idle per eager kernel */
    double node_gap_us;          /* node_device_us - tiny_kernel_us: idle per graph node */
    double graph_gap_us;         /* device time a graph launch adds beyond its nodes */
    /* One-off costs of a graph (sg_graph_get_stats): base per graph + per node. */
    double capture_base_us, capture_node_us;         /* warm-up excluded */
    double instantiate_base_us, instantiate_node_us; /* instantiate + upload */
    double exec_base_bytes, exec_node_bytes;         /* device memory of the executable graph */
    int device_timed;            /* the device fields above are measured (CUPTI was there) */
    char note[256];              /* why they are not */
} sg_advise_calib;

/* Measures the calibration on ctx (a CUDA context; ~1 s): host time per eager launch, host
 * time of replaying graphs of 1, 16, 64 and 256 tiny kernels, device time per eager kernel, per
 * graph node and per graph launch, capture and instantiate time and executable-graph memory
 * per node. Leaves nothing allocated. SG_ERR_UNSUPPORTED on the CPU backend and with
 * STEPGRAPH_DISABLE_GRAPHS=1. One calibration serves any number of models (options.calib). */
sg_status sg_advise_calibrate(sg_ctx *ctx, sg_advise_calib *out);

/* Launches per step, and the host time queuing them, of one region of an eager step. */
typedef struct sg_advise_region {
    double launches;
    double host_us;
} sg_advise_region;

/* A child of the model's Sequential: the modules layer scope wraps, two graphs apiece. */
typedef struct sg_advise_module {
    char name[96];               /* the module's name, e.g. "blocks.3" */
    sg_advise_region forward, backward;
} sg_advise_module;

/* What eager steps of the model show (AdamW, seed 1). */
typedef struct sg_advise_profile {
    char model[64];
    sg_dtype precision;
    /* Timed like `stepgraph bench`: blocks of eager steps, synced at the end, median. */
    double wall_ms;              /* ms per step */
    double block_host_ms;        /* host ms per step queuing a block (waits on a full queue
                                  * included: not the cost of queuing, when GPU-bound) */
    double launches;             /* per step (sg_ctx_launch_count) */
    /* CUPTI over a window of steps; NAN when CUPTI was not available (see note). */
    double busy_ms;              /* GPU-busy per step: union of device activity */
    double kernels;              /* device kernels per step */
    double short_kernel_share;   /* share of them shorter than SG_PROF_SHORT_KERNEL_US */
    /* One instrumented eager step (the median of a few, each queued on an idle device):
     * launches and host time by region, from the step's named ranges. */
    sg_advise_region step;       /* all of it: host_us is the cost of queuing a step */
    sg_advise_region load;       /* the batch load, before the forward */
    sg_advise_region forward;    /* the net's forward and backward: what model scope captures */
    sg_advise_region backward;
    sg_advise_module modules[SG_ADVISE_MAX_MODULES];
    int n_modules;               /* 0: the net is not a Sequential: layer scope wraps nothing */
    /* The rest of the step (loss, optimizer) is step - load - forward - backward. */
    sg_advise_region load_static;/* the batch load once inputs are static (captured scopes copy
                                  * the batch in; eager steps of an mlp only rebind views) */
    double static_bytes;         /* device bytes the static inputs add (0: the model has them) */
    /* A trial capture of the step region (host syncs, data-dependent control flow). */
    int capture_tried;
    int step_captured;
    int step_nodes;              /* its nodes; 0 when unknown (then estimated from kernels) */
    char capture_error[512];     /* why the capture was refused */
    int shapes_static;           /* no shape buckets: one graph serves every step */
    char note[256];              /* why CUPTI numbers are missing */
    /* Micro-batches per step (0 or 1: one). With K > 1 the regions above are a whole optimizer
     * step's: load K loads (K times the first micro-batch's), forward, backward and each
     * module's the sums over the K micro-batches, load_static K static loads; under layer
     * and model scope every graph replays K times a step. */
    int accum;
    /* Steps a launch under step scope (sg_trainer_options.steps_per_call; 0 or 1: one) and
     * whether they are a WHILE loop (loop): the regions above stay one step's, and the step
     * scope's prediction shares the launch among the steps (docs/advisor.md). */
    int steps_per_call;
    int loop;
    /* One step's work (sg_trainer_stats.work of the eager steps above; work_counted 0: none). */
    sg_work work;
    int work_counted;
    /* The eager step's device time by op family, from the busy_ms window (sg_prof_family_us),
     * ms a step; [SG_WORK_FAMILIES]: work outside every op. NAN where no profiler ran. */
    double family_ms[SG_WORK_FAMILIES + 1];
} sg_advise_profile;

/* One scope's prediction. */
typedef struct sg_advise_prediction {
    sg_scope scope;
    double step_ms;              /* max(host_ms, device_ms); eager: the profiled wall time */
    double host_ms;              /* host time to queue a step under the scope */
    double device_ms;            /* GPU-busy + the device idle launches leave */
    int host_bound;              /* host_ms >= device_ms */
    double speedup;              /* eager wall / step_ms */
    double launches;             /* launches per step (graph launches count one) */
    double graphs;               /* graph launches per step */
    double nodes;                /* graph nodes replayed per step */
    double eager_kernels;        /* device kernels still launched eagerly per step */
    double capture_ms, instantiate_ms;
    double setup_ms;             /* capture + instantiate: paid once */
    double saving_ms;            /* per step: eager wall - step_ms */
    double break_even_steps;     /* setup / saving; INFINITY when nothing is saved; 0 eager */
    double extra_bytes;          /* static inputs + executable graphs */
    int capturable;              /* 0: the trial capture refused the step (step scope), or the
                                  * net has no modules to wrap (layer scope) */
    char note[256];              /* why SG_ERR_INVALID / SG_ERR_UNSUPPORTED was returned, or why
                                  * the scope cannot be captured */
} sg_advise_prediction;

/* Predicts one scope from a calibration and a profile. SG_ERR_NULL, SG_ERR_INVALID (a scope
 * outside sg_scope, a negative or non-finite input, layer scope without modules: out->note
 * says which), or SG_ERR_UNSUPPORTED when the device side is unknown (no CUPTI: GPU-busy or
 * gaps missing). */
sg_status sg_advise_predict(const sg_advise_calib *c, const sg_advise_profile *p, sg_scope scope,
                            sg_advise_prediction *out);

/* The checklist and the verdict, from the predictions of every scope (pred[s] for scope s). */
typedef struct sg_advise_summary {
    double gpu_utilisation;      /* GPU-busy / eager wall */
    double launch_share;         /* (eager wall - the step scope's device time) / eager wall:
                                  * the share of the eager step that launches cost */
    double short_kernel_share;   /* kernels under SG_PROF_SHORT_KERNEL_US */
    int shapes_static;
    int host_syncs;              /* the trial capture of the step was refused */
    sg_scope best;               /* the recommendation: the fastest predicted scope that can be
                                  * captured (eager when none beats it) */
    double best_speedup;
    char verdict[320];           /* why, in one line: "launch-bound: graphs pay (step scope ...)" */
} sg_advise_summary;

/* SG_ERR_NULL, or SG_ERR_INVALID when pred is not every scope in order with a step time. */
sg_status sg_advise_summarize(const sg_advise_calib *c, const sg_advise_profile *p,
                              const sg_advise_prediction pred[SG_ADVISE_SCOPES],
                              sg_advise_summary *out);

/* A break-even step count as printed: "never" (INFINITY), "-" (eager), else "%.0f". */
const char *sg_advise_steps_str(double steps, char *buf, size_t n);

/* One scope trained and timed as the profile's eager steps were. */
typedef struct sg_advise_measurement {
    sg_scope scope;
    double step_ms;              /* median over blocks of wall time per step */
    double host_ms;              /* host ms per step queuing a block */
    double launches;             /* per step */
    double busy_ms;              /* CUPTI; NAN when not available */
    int graphs, nodes;
    double capture_ms, instantiate_ms;
    double exec_bytes;           /* executable graphs' device memory */
    double bytes;                /* device bytes the model, optimizer, trainer and graph pools
                                  * hold (allocator, in use), after the warm-up */
    int fell_back;
    char fallback_reason[512];
} sg_advise_measurement;

/* Builds a model on ctx; the advisor calls it once for the profile and once for each scope
 * it measures, and destroys each model it gets (sg_model_destroy). Every call must build the
 * same model: same name, shapes, precision and seed. A built-in model by name:
 * sg_model_create_ex; one of your own: the builder (sg_builder_finish). A factory that fails
 * fails sg_advise with its status (and its message on ctx). */
typedef sg_status (*sg_model_factory)(sg_ctx *ctx, void *user, sg_model **out);

/* How far sg_advise has come, for a caller that shows results as they arrive. */
typedef enum sg_advise_stage {
    SG_ADVISE_STAGE_PROFILED = 0,  /* calib and profile are filled */
    SG_ADVISE_STAGE_PREDICTED,     /* every scope's prediction and the summary */
    SG_ADVISE_STAGE_MEASURED       /* scopes[scope] was measured, or its measurement failed */
} sg_advise_stage;

typedef struct sg_advise_result sg_advise_result;
typedef void (*sg_advise_progress_fn)(void *user, const sg_advise_result *r, sg_advise_stage stage,
                                      sg_scope scope);

typedef struct sg_advise_options {
    /* Timing of the profile and of each measurement, as `stepgraph bench` times. */
    int warmup;                  /* untimed steps first, capture included (default 20; >= 5) */
    int steps;                   /* steps per timed block (default 50) */
    int repeats;                 /* blocks, 1 to 1000; the median is taken (default 5) */
    int busy_steps;              /* steps in the CUPTI window for GPU-busy time (default 20) */
    int measure;                 /* 1 (default): train under every scope that can be captured
                                  * and time it; 0: predict only */
    const sg_advise_calib *calib;/* a calibration to reuse (sg_advise_calibrate: one serves many
                                  * models); NULL: calibrate now (~1 s) */
    sg_advise_progress_fn progress; /* called as each stage completes (NULL: none) */
    void *progress_user;
    int hold_cpu;                /* 1 (default): hold the calling thread on the CPU core it runs on
                                  * while calibrating, profiling and measuring, then give it its
                                  * affinity back. A host-bound step's time depends on the core
                                  * (H100 machine, 16 vCPUs: resnet18-32-32 bf16's eager step took
                                  * 3.7 to 5.8 ms by core, within 4% on any one), and a prediction
                                  * must see the core its measurement sees; 0: leave the thread to
                                  * the scheduler */
    int accum;                   /* micro-batches per optimizer step (sg_trainer_options.accum,
                                  * default 1): the profile, the trial capture and every
                                  * measurement train accumulated steps, and every figure is per
                                  * optimizer step */
    /* The other trainer options the profile and the measurements train with (NULL: defaults):
     * the control-flow forms and steps_per_call (the step scope's graph holds that many steps;
     * the other scopes run them one by one). Every figure stays per optimizer step. scope,
     * warmup and accum are the advisor's. */
    const sg_trainer_options *trainer;
    sg_dtype optim_state;        /* the AdamW moments' dtype the profile, the trial capture and
                                  * every measurement train with (sg_optim_set_state_dtype):
                                  * SG_DTYPE_F32 (default) or SG_DTYPE_BF16 (f32 parameters) */
} sg_advise_options;

sg_advise_options sg_advise_options_default(void);

/* One scope: the prediction, and the measurement beside it. */
typedef struct sg_advise_scope_result {
    sg_scope scope;
    sg_advise_prediction predicted;
    int measured;                /* 1: measurement holds the scope's timing */
    sg_advise_measurement measurement;
    sg_status measure_status;    /* SG_OK, or why measuring failed (measure_note says more) */
    char measure_note[512];      /* why the scope was not measured: not capturable, measure 0,
                                  * eager failed, or the failure's message */
    /* Against the measured eager step (NAN unless both were measured): */
    double error_pct;            /* 100 (predicted - measured) / measured step ms */
    double measured_speedup;     /* eager's measured step ms / this scope's */
    double measured_extra_bytes; /* device bytes beyond eager's: static inputs, pools, graphs */
} sg_advise_scope_result;

struct sg_advise_result {
    char model[64];              /* sg_model_name of what the factory built */
    sg_dtype precision;
    char device[320];
    sg_advise_options options;   /* as run (calib and progress cleared) */
    sg_advise_calib calib;
    sg_advise_profile profile;
    sg_advise_scope_result scopes[SG_ADVISE_SCOPES];  /* by sg_scope */
    sg_advise_summary summary;   /* the checklist, the recommended scope (summary.best) and why */
    double best_measured_speedup;/* the recommended scope's measured speedup (NAN: unmeasured) */
    char verdict[400];           /* summary.verdict with the measured speedup added:
                                  * "launch-bound: graphs pay (step scope predicted 1.78x;
                                  * measured 1.85x)" */
    int measure_failures;        /* scopes whose measurement failed */
    int cpu;                     /* the core the thread was held on, -1 for none (hold_cpu 0, or
                                  * the affinity could not be set: cpu_note says why) */
    char cpu_note[160];
    /* Speed of light: this device's peaks in the model's precision (sg_device_peaks_measure,
     * after the profile) and the floor of profile.work on them; sol_ok 0 where either is
     * missing (sol_note says why). A measured scope reaches sol.floor_ms / its step ms. */
    sg_device_peaks peaks;
    sg_sol sol;
    int sol_ok;
    char sol_note[256];
};

/* Advises the model `factory` builds on ctx (a CUDA context): calibrates (unless opts->calib),
 * profiles eager steps, tries to capture the step, predicts every scope, summarizes, then
 * (opts->measure) trains under each scope that can be captured, eager first, and times it.
 * opts NULL: defaults. SG_OK when everything asked for was done. A failed calibration,
 * profile or prediction (no CUPTI: SG_ERR_UNSUPPORTED) fails the call; a failed measurement
 * is recorded in its scope and the others still run (all but eager's: the others are relative
 * to it), and the call returns the first such failure's status once out is complete. The
 * message is on ctx; out holds whatever was done either way. */
sg_status sg_advise(sg_ctx *ctx, sg_model_factory factory, void *user,
                    const sg_advise_options *opts, sg_advise_result *out);
/* sg_advise for a built-in model by name: sg_model_create_ex(ctx, name, seed 1, mo). */
sg_status sg_advise_name(sg_ctx *ctx, const char *name, const sg_model_options *mo,
                         const sg_advise_options *opts, sg_advise_result *out);

/* ---- the advisor for generation: what a token costs in each sg_gen_mode ----------------- *
 *
 * Before generating in a mode, sg_advise_generate says what a new token will cost in each
 * (eager, step, loop) for a generator and a request: it times the parts of one decode step (its
 * launches, the host time to queue it eagerly, the device time of its graph and of a replay's
 * host call, the flag read each token of eager and step mode, a WHILE node's turn), predicts
 * every mode's per-token latency from them and the calibration (docs/advisor.md, "Generation"),
 * then generates in each mode with sg_generate and measures it, beside the prediction. On the
 * CPU backend it runs too, without a calibration (its launch terms 0): a check of the flow
 * there, not a GPU's prediction. Times are microseconds unless a name says ms. */

/* The parts of a decode step, each timed over the k = max_new - 1 decode steps of a run after
 * its prefill (the positions the measured runs decode at), medians of the repeats. */
typedef struct sg_advise_gen_profile {
    int64_t steps;               /* k */
    double launches;             /* L: launches of one eager decode step (0 on the CPU backend) */
    int nodes;                   /* N: nodes of the decode step's graph */
    double host_us;              /* H: host time queuing one eager decode step on an idle device */
    double replay_us;            /* R: host time of one replay of the decode graph on an idle
                                  * device (0 on the CPU backend, whose replay runs the work:
                                  * that is graph_us) */
    double graph_us;             /* D: device time per replayed decode graph: k replays queued
                                  * back to back after a finished prefill, / k */
    double readback_us;          /* S: a one-element sg_tensor_copy_to_host on an idle device */
    double while_turn_us;        /* P: a turn of a WHILE node whose body is one tiny kernel (NAN
                                  * where capture cannot make WHILE nodes) */
} sg_advise_gen_profile;

/* One mode: the prediction's terms and total, and the measurement beside it. */
typedef struct sg_advise_gen_mode {
    sg_gen_mode mode;
    int predicted;               /* 0: the mode cannot run here (note says why) */
    double host_us;              /* host term: H (eager), R (step), 0 (loop: one launch a call) */
    double device_us;            /* device term: the decode step's device time in the mode */
    double sync_us;              /* the flag read a token: S (eager, step), 0 (loop) */
    double predicted_ms;         /* per token: eager max(host, device) + sync; step host +
                                  * device + sync; loop device */
    int measured;                /* 1: the fields below hold the mode's timing */
    double prefill_ms;           /* median of runs of max_new 1 */
    double total_ms;             /* median of runs of max_new */
    double measured_ms;          /* per token: (total_ms - prefill_ms) / k */
    double host_us_per_token;    /* median of the full runs' host_us / max_new */
    double ratio;                /* predicted_ms / measured_ms (NAN unless measured) */
    char note[256];
} sg_advise_gen_mode;

typedef struct sg_advise_gen_result {
    char device[320];
    int batch;                   /* the request's sequences */
    int64_t prompt_len;          /* its longest prompt */
    int64_t max_new;
    int repeats;
    sg_advise_calib calib;       /* as used: the caller's, this device's, or (CPU) zeros */
    sg_advise_gen_profile profile;
    sg_advise_gen_mode modes[3]; /* by sg_gen_mode */
    int cpu;                     /* the core the thread was held on, -1 for none (cpu_note) */
    char cpu_note[160];
} sg_advise_gen_result;

/* One mode's prediction from a calibration c and a profile p, pure arithmetic (as
 * sg_advise_predict; docs/advisor.md, "Generation"): sets out->mode, predicted, the three terms,
 * predicted_ms and note, and leaves the measured fields alone. The eager device term is the
 * graph's device time with its launch and node gaps swapped for eager ones,
 * D - graph_gap - N node_gap + L eager_gap; the loop's is the graph's less its launch gap plus
 * what a WHILE turn costs beyond its tiny kernel, D - graph_gap + (P - node_device). Where c has
 * no device timings (device_timed 0, as on the CPU backend) the gaps count 0. Loop mode with P
 * NAN: predicted 0 and SG_OK (note: why). SG_ERR_NULL; SG_ERR_INVALID for a mode out of range
 * or a negative or non-finite input (note names it). */
sg_status sg_advise_gen_predict(const sg_advise_calib *c, const sg_advise_gen_profile *p, sg_gen_mode mode,
                                sg_advise_gen_mode *out);

/* Advises generating r on g (a generator on ctx). Every sequence runs r->max_new (>= 2) tokens:
 * the advisor's copy of r drops stop and max_new_each, and r->mode is not read. opts NULL:
 * defaults; of them it takes repeats (each timing's median), measure (0: predict only), calib
 * (NULL: sg_advise_calibrate on CUDA, zeros on the CPU backend) and hold_cpu. SG_ERR_NULL, or
 * SG_ERR_INVALID (a request sg_generate refuses, max_new below 2, g on another context, a
 * calibration with a negative or non-finite term) and SG_ERR_UNSUPPORTED (graphs disabled), with
 * the message on ctx; any failure leaves the generator usable. Where capture cannot make WHILE
 * nodes, loop mode is neither predicted nor measured (its note says why). */
sg_status sg_advise_generate(sg_ctx *ctx, sg_generator *g, const sg_generate_request *r,
                             const sg_advise_options *opts, sg_advise_gen_result *out);

/* ---- verify: a captured scope against eager, step by step ------------------------------- *
 *
 * Trains two copies of the model `factory` builds (it is called twice and must build the same
 * model, seed included): one eagerly, one under opts->scope; after each step compares their
 * loss, loss scaler, gradients, parameters and buffers, bit for bit (atol = rtol = 0) or within
 * |a - b| <= atol + rtol |a|, and stops at the first step that differs, naming the first
 * tensor that does (a parameter's name, ".grad" for its gradient). `stepgraph verify` is this
 * call on a built-in model. A run whose graph side never replayed a graph (capture fell back,
 * or too few steps) does not pass: it would compare eager with eager. */

/* One step's comparison. */
typedef struct sg_verify_step {
    int64_t step;                /* 1-based */
    float loss_eager, loss_graph;
    double max_dloss, max_dgrad, max_dparam;   /* largest |eager - graph| */
    double max_dbuffer;                        /* over the buffers (0 without) */
} sg_verify_step;

typedef struct sg_verify_options {
    sg_scope scope;              /* checked against eager (default step) */
    int64_t steps;               /* default 20; under a captured scope at least warmup + 2 */
    int warmup;                  /* the graph side's eager steps before capture (default 3) */
    float clip;                  /* both sides: clip gradients to this global norm (0: off) */
    const char *graph_modules;   /* layer scope: as sg_trainer_options */
    double atol, rtol;           /* 0, 0 (default): bit for bit */
    sg_optim_kind optim;         /* both sides (default AdamW) */
    int accum;                   /* both sides: micro-batches per optimizer step, as
                                  * sg_trainer_options.accum (default 1); steps count optimizer
                                  * steps, compared after each */
    /* Both sides' other trainer options (NULL: sg_trainer_options_default()): the control-flow
     * forms (loop, skip_if, vary_seq with seq_buckets, early stop) and steps_per_call. The
     * fields above override scope, warmup, graph_modules (the graph side's; the eager side is
     * eager), clip and accum. With steps_per_call K a compared step is a call of K steps
     * (trainer step index step * K); with an early-stop rule both sides' step counts and
     * reasons must agree too. */
    const sg_trainer_options *trainer;
    /* Optional hooks, with user: before_step may change both optimizers alike (a learning-rate
     * schedule); after_step sees both models after the step, before the comparison; on_step
     * gets each step's comparison. A hook's failure stops the run with its status. */
    void *user;
    sg_status (*before_step)(void *user, int64_t step, sg_optim *eager, sg_optim *graph);
    sg_status (*after_step)(void *user, int64_t step, sg_model *eager, sg_model *graph);
    void (*on_step)(void *user, const sg_verify_step *row);
    sg_dtype optim_state;        /* both sides: sg_optim_set_state_dtype (default F32) */
} sg_verify_options;

sg_verify_options sg_verify_options_default(void);

typedef struct sg_verify_result {
    int passed;                  /* every step matched and the graph side replayed graphs */
    int64_t steps;               /* steps compared */
    int64_t replayed;            /* of them, steps the graph side ran from graphs */
    int64_t mismatch_step;       /* the first step that differed (1-based), 0 if none */
    char mismatch[256];          /* what differed first, e.g. "blocks.0.attn.qkv.weight.grad
                                  * (element 812 of the flat buffer: eager 0.1, graph 0.2)" */
    char no_graph[768];          /* passed = 0 with no mismatch: why nothing was replayed */
    sg_trainer_stats stats;      /* the graph side's trainer */
} sg_verify_result;

/* SG_OK when the comparison ran to its end or to a mismatch (out->passed says which); an error
 * status (message on ctx) when a model, optimizer, trainer or step failed or the options are
 * invalid (SG_ERR_INVALID: steps too few to replay a graph, a graph scope with
 * STEPGRAPH_DISABLE_GRAPHS=1). opts NULL: defaults. */
sg_status sg_verify(sg_ctx *ctx, sg_model_factory factory, void *user, const sg_verify_options *opts,
                    sg_verify_result *out);

#ifdef __cplusplus
}
#endif
#endif /* STEPGRAPH_H */
