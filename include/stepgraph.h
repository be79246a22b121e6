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
    size_t workspace_bytes;     /* cuBLASLt workspace, fixed for the context's life */
    size_t alloc_limit_bytes;   /* 0: none. Reserving past it fails with SG_ERR_OOM (tests) */
} sg_ctx_options;

sg_ctx_options sg_ctx_options_default(void);

/* Creates a context: one non-blocking stream, one cuBLASLt handle bound to one workspace.
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
    SG_ACT_GELU      /* tanh approximation, as GPT-2 */
} sg_activation;

/* y(M,N) = act(x(M,K) @ w(N,K)^T + b(N)). b may be NULL. w is stored (out, in) as PyTorch's.
 * pre(M,N): the pre-activation, written when act is GELU (needed by the backward), else NULL. */
sg_status sg_linear_forward(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *w,
                            const sg_tensor *b, sg_activation act, sg_tensor *y, sg_tensor *pre);
/* Given dy(M,N): dx(M,K) (may be NULL: not needed), dw(N,K), db(N) (may be NULL).
 * act: the forward's activation; with RELU, act_in is the forward output y; with GELU, the
 * forward's pre. dy is overwritten with d(pre) when act is not NONE (it is scratch). */
sg_status sg_linear_backward(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *w,
                             sg_tensor *dy, sg_activation act, const sg_tensor *act_in,
                             sg_tensor *dx, sg_tensor *dw, sg_tensor *db);

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

/* Dropout with a counter-based generator (Philox-4x32-10): the keep mask of element i at call
 * site `site` is a pure function of (seed, offset, site, i), where seed and offset live in rng
 * (4 I32 on the device: seed lo, seed hi, offset lo, offset hi). The backward at the same site
 * regenerates the same mask; sg_rng_advance adds one to the offset (once per step), so replays
 * of a captured step draw fresh masks, and eager and captured runs with the same seed draw the
 * same ones. y = x * keep / (1 - p); p = 0 copies. */
sg_status sg_dropout_forward(sg_ctx *ctx, const sg_tensor *x, float p, const sg_tensor *rng,
                             uint32_t site, sg_tensor *y);
sg_status sg_dropout_backward(sg_ctx *ctx, const sg_tensor *dy, float p, const sg_tensor *rng,
                              uint32_t site, sg_tensor *dx);
sg_status sg_rng_advance(sg_ctx *ctx, sg_tensor *rng);

/* Global-norm gradient clipping over a flat buffer: norm = sqrt(sum g^2) (deterministic order),
 * g *= min(1, max_norm / (norm + 1e-6)); norm (1 F32) and nonfinite (1 I32: 1 when a value is
 * inf or NaN, then g is left unscaled) are written on the device. max_norm <= 0: only measure. */
sg_status sg_clip_grad_norm(sg_ctx *ctx, sg_tensor *grad, float max_norm, sg_tensor *norm,
                            sg_tensor *nonfinite);

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

/* Optimizer hyperparameters, as they live in device memory (read by the kernels). */
typedef struct sg_optim_hparams {
    float lr, beta1, beta2, eps, weight_decay;  /* AdamW */
    float momentum, dampening;                   /* SGD (lr and weight_decay shared) */
    float step;                                  /* steps taken; the kernel increments it */
} sg_optim_hparams;

/* AdamW over a flat buffer of P elements cut into n_seg parameter tensors: seg_start
 * (n_seg+1, I32) holds each tensor's first element and P last; weight decay applies where
 * seg_decay (n_seg, I32) is nonzero. hp (8 F32): sg_optim_hparams in device memory, read by
 * the kernel; hp.step is incremented by one in the same launch. param/grad/m/v: F32 (P).
 * skip (1 I32, device; may be NULL): when nonzero the kernel changes nothing, hp.step
 * included (a step with non-finite gradients). param_lo (P, BF16; may be NULL): the compute
 * copy of mixed precision, written as bf16(param) in the same pass (left alone on a skip). */
sg_status sg_adamw_step(sg_ctx *ctx, sg_tensor *param, const sg_tensor *grad, sg_tensor *m,
                        sg_tensor *v, sg_tensor *hp, const sg_tensor *seg_start,
                        const sg_tensor *seg_decay, int n_seg, const sg_tensor *skip,
                        sg_tensor *param_lo);
/* SGD with momentum over the same layout: buf = momentum*buf + (1-dampening)*g (g includes
 * weight decay); param -= lr * buf. On the first step buf = g, as PyTorch. skip and param_lo
 * as for AdamW. */
sg_status sg_sgd_step(sg_ctx *ctx, sg_tensor *param, const sg_tensor *grad, sg_tensor *buf,
                      sg_tensor *hp, const sg_tensor *seg_start, const sg_tensor *seg_decay,
                      int n_seg, const sg_tensor *skip, sg_tensor *param_lo);


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

typedef struct sg_model_options {
    const char *data_path;     /* gpt: the text to train on (NULL: a licence text of the system) */
    float dropout;             /* gpt: dropout probability after the embedding and each branch */
    /* SG_DTYPE_F32 (the default) or SG_DTYPE_BF16 (gpt): mixed precision. bf16 activations,
     * matmuls (f32 accumulation) and gradients, read from bf16 copies of the parameters; f32
     * master weights and optimizer state; dynamic loss scaling on the device, a step whose
     * gradients are not finite skipped by a device flag (sg_trainer_get_scaler). */
    sg_dtype precision;
    /* Data parallelism: the model trains on part `shard` of `shards` equal parts of every batch
     * (rows shard*B/shards .. of the name's batch B, which they must divide) and builds its
     * buffers for B/shards rows, so `shards` models together see the rows one model of batch B
     * sees. 0 and 0 (or 1): the whole batch. */
    int shard, shards;
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
sg_tensor *sg_model_grads(sg_model *m);

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
/* One optimizer step over all parameters: one kernel launch. */
sg_status sg_optim_step(sg_optim *o);

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
    /* Clip gradients to this global norm inside the step (0: no clipping). */
    float clip;
    /* Data parallelism (NULL: none): gradients are averaged over the ranks of dist inside the
     * step, in buckets overlapping the backward pass; the model must be built with shard =
     * its rank and shards = its world size. Captured scopes run at least SG_DIST_MIN_WARMUP
     * eager steps first. Not with batch or sequence buckets. dist must outlive the trainer. */
    struct sg_dist *dist;
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
    /* Memory, in bytes of whole allocator blocks (as sg_alloc_stats counts them). The static
     * buffers, allocated when the model, optimizer and trainer were built, and never again: */
    size_t param_bytes;         /* parameters: f32 masters (+ bf16 copies), segment tables */
    size_t grad_bytes;          /* gradients: f32 (+ bf16 in mixed precision) */
    size_t optim_bytes;         /* optimizer state: moments and device hyperparameters */
    size_t data_bytes;          /* the data set held on the device */
    size_t activation_bytes;    /* the rest of the model: activations and their gradients,
                                 * workspaces, static inputs, loss, scaler */
    sg_alloc_stats graph_pool;  /* the pool the trainer's graphs share (zeros without graphs):
                                 * what capture needed beyond the static buffers */
} sg_trainer_stats;

sg_trainer_options sg_trainer_options_default(void);
const char *sg_scope_name(sg_scope s);
/* "eager", "layer", "model" or "step". */
sg_status sg_scope_parse(const char *s, sg_scope *out);
/* Trains m with o under opts->scope. Captured scopes give the model static inputs (each step
 * copies its batch in). STEPGRAPH_DISABLE_GRAPHS=1 runs every scope eagerly. */
sg_status sg_trainer_create(sg_model *m, sg_optim *o, const sg_trainer_options *opts,
                            sg_trainer **out);
void sg_trainer_destroy(sg_trainer *t);
/* One training step on batch `index` (steps_per_call steps: batches index, index+1, ...): the
 * first `warmup` calls run eagerly, the next captures, later ones replay. */
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
sg_status sg_trainer_get_stats(const sg_trainer *t, sg_trainer_stats *out);
/* The loss scaler's state (scale, steps skipped for non-finite gradients...): a host sync.
 * fp32 models hold one too, unused (scale 65536, nothing skipped). */
sg_status sg_trainer_get_scaler(sg_trainer *t, sg_loss_scaler *out);
/* Mean loss over n_batches batches of a split (0 train, 1 validation: gpt models hold one out),
 * forward only, eagerly, dropout off; a host sync. */
sg_status sg_trainer_eval(sg_trainer *t, int split, int n_batches, float *out);
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
/* A checkpoint in the safetensors format: every parameter by name, the optimizer's state
 * (moments, hyperparameters and step count), the dropout generator, and in the metadata
 * "format" "stepgraph-1", "model", "step" (0 to SG_TRAINER_MAX_STEP, else SG_ERR_INVALID) and
 * "precision" (sg_dtype_name: "f32" or "bf16"); written to a temporary file, flushed and
 * renamed, as sg_checkpoint_check_path describes. A tensor holding NaN or Inf is refused
 * (SG_ERR_INVALID, naming it) and nothing is written: a non-finite checkpoint never is. */
sg_status sg_trainer_save(sg_trainer *t, int64_t step, const char *path);
/* Loads such a checkpoint into the trainer's model and optimizer; *step: the next step.
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

#ifdef __cplusplus
}
#endif
#endif /* STEPGRAPH_H */
