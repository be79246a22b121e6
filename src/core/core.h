/* core.h: internal declarations of the core layer (context, status, allocator, tensors).
 * Included by every layer above and by .cu files (it is C and C++ compatible). The public
 * types are opaque in stepgraph.h; their fields are here. */
#ifndef SG_CORE_H
#define SG_CORE_H

#include "stepgraph.h"

#include <stdarg.h>
#include <stdbool.h>
#include <string.h>
#include <sys/stat.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- time ---- */

/* Microseconds of CLOCK_MONOTONIC: the one clock the layers time themselves with. */
double sg_clock_us(void);
/* The median of v[0..n) (sorted in place; the mean of the middle two for even n); NAN for n <= 0.
 * The one median the library's measurements take (the advisor's, the matmul timing's). */
double sg_median(double *v, int n);

/* ---- errors ---- */

/* Internal invariant (a bug in stepgraph, never a user error): prints and aborts. */
#define SG_ASSERT(cond)                                                                       \
    do {                                                                                      \
        if (!(cond)) sg_assert_fail(#cond, __FILE__, __LINE__);                               \
    } while (0)
void sg_assert_fail(const char *cond, const char *file, int line);

/* Records a formatted message on ctx (or the thread's create error when ctx is NULL) and
 * returns st, so that callers write `return sg_fail(ctx, SG_ERR_SHAPE, "...", ...)`. */
sg_status sg_fail(const sg_ctx *ctx, sg_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
sg_status sg_vfail(const sg_ctx *ctx, sg_status st, const char *fmt, va_list ap);

/* Propagates a non-OK status. */
#define SG_TRY(expr)                                                                          \
    do {                                                                                      \
        sg_status sg_try_st_ = (expr);                                                        \
        if (sg_try_st_ != SG_OK) return sg_try_st_;                                           \
    } while (0)

/* ---- device interface: one table per backend (CPU, CUDA), filled slot by slot ---- */

typedef struct sg_device_i {
    const char *name;
    sg_status (*init)(sg_ctx *ctx);               /* stream, handles, workspace */
    void (*shutdown)(sg_ctx *ctx);
    sg_status (*malloc)(sg_ctx *ctx, size_t bytes, void **out);
    void (*free)(sg_ctx *ctx, void *p);
    sg_status (*copy_h2d)(sg_ctx *ctx, void *dst, const void *src, size_t n);  /* async */
    sg_status (*copy_d2h)(sg_ctx *ctx, void *dst, const void *src, size_t n);  /* waits */
    sg_status (*copy_d2h_async)(sg_ctx *ctx, void *dst, const void *src, size_t n); /* pinned dst */
    sg_status (*copy_d2d)(sg_ctx *ctx, void *dst, const void *src, size_t n);  /* async */
    sg_status (*sync)(sg_ctx *ctx);
    /* Pinned host memory and events, for asynchronous read-back. */
    sg_status (*host_alloc)(sg_ctx *ctx, size_t bytes, void **out);
    void (*host_free)(sg_ctx *ctx, void *p);
    sg_status (*event_create)(sg_ctx *ctx, void **ev);
    void (*event_destroy)(sg_ctx *ctx, void *ev);
    sg_status (*event_record)(sg_ctx *ctx, void *ev);
    sg_status (*event_query)(sg_ctx *ctx, void *ev);   /* SG_OK done, SG_ERR_NOT_READY */
    sg_status (*event_sync)(sg_ctx *ctx, void *ev);
    /* Free and total bytes of the memory tensors come from (the GPU's, or the host's RAM). */
    sg_status (*mem_info)(sg_ctx *ctx, size_t *free_bytes, size_t *total_bytes);
} sg_device_i;

extern const sg_device_i sg_device_cpu;
#ifdef SG_HAVE_CUDA
extern const sg_device_i sg_device_cuda;
#endif

/* ---- allocator ---- */

#define SG_ALLOC_CLASSES 512

typedef struct sg_block {
    void *ptr;
    size_t size;             /* the size class's bytes */
    int cls;
    bool in_use;
    struct sg_block *next_free;
    struct sg_block *next_all;
} sg_block;

struct sg_pool {
    sg_ctx *ctx;
    char name[48];
    sg_block *free_list[SG_ALLOC_CLASSES];
    sg_block *all;
    sg_alloc_stats st;
    struct sg_pool *next;
};

/* Takes a block of at least `bytes` from pool (from its cache if it can). */
sg_status sg_pool_alloc(sg_pool *pool, size_t bytes, sg_block **out);
/* Returns the block to its pool's cache. Stream-ordered: with one stream per context, work
 * queued later that reuses the block runs after all work queued before the free. */
void sg_pool_free(sg_pool *pool, sg_block *b);
/* Size class of a request, and that class's size in bytes. */
int sg_alloc_class(size_t bytes);
size_t sg_alloc_class_size(int cls);

/* ---- capture state ---- */

/* CPU work is queued through sg_cpu_run: run now, or recorded into the capture's plan. */
typedef sg_status (*sg_cpu_thunk)(sg_ctx *ctx, const void *args);
typedef struct sg_plan sg_plan;

typedef struct sg_capture {
    bool active;
    bool failed;               /* a forbidden call happened: the capture is void */
    sg_status fail_status;
    char fail_msg[1024];
    sg_pool *pool;             /* the graph's pool: every allocation comes from here */
    sg_plan *plan;             /* CPU backend: where op calls are recorded */
    sg_block **deferred;       /* blocks of other pools freed during capture (graph keeps them) */
    sg_pool **deferred_pool;
    int n_deferred, cap_deferred;
    sg_tensor **dead;          /* CPU: tensors destroyed during capture; the plan still names them */
    int n_dead;
} sg_capture;

/* ---- context ---- */

/* Slots of sg_ctx_scratch: one persistent device buffer per CUDA kernel family that keeps
 * reduction partials or "last block done" counters between launches. A slot's owner fixes its
 * layout; nobody else writes it. Tests read some of them (the counters must be back at 0). */
typedef enum sg_scratch_slot {
    SG_SLOT_LINEAR = 0, /* ops/linear_cuda.cu: dact_bias_kernel's bias-gradient partials and
                         * counters */
    SG_SLOT_LOSS,       /* ops/loss_cuda.cu: xent/mse partials and the last-block counter */
    SG_SLOT_OPTIM,      /* ops/optim_cuda.cu: the optimizer's last-block counter
                         * (SG_OPTIM_SCRATCH_BYTES); nn/optim.c allocates it when the optimizer
                         * is created */
    SG_SLOT_LAYERNORM,  /* ops/layernorm_cuda.cu: the backward's per-block dgamma/dbeta partials */
    SG_SLOT_AMP,        /* ops/amp_cuda.cu: the unscale's overflow word and counter
                         * (SG_AMP_SCRATCH_BYTES); nn/optim.c allocates it with the scaler */
    SG_SLOT_CLIP,       /* ops/clip_cuda.cu: the norm's partials, counter and result
                         * (SG_CLIP_SCRATCH_BYTES) */
    SG_SLOT_BATCHNORM,  /* ops/batchnorm_cuda.cu: per-part channel sums of the forward's
                         * statistics and the backward's dgamma/dbeta */
    SG_SLOT_LINEAR_SIDE, /* ops/linear_cuda.cu: as SG_SLOT_LINEAR, for the bias sums queued on
                          * the context's second stream (sg_ctx_side_stream) */
    SG_SLOT_LAYERNORM_B, /* ops/layernorm_cuda.cu: as SG_SLOT_LAYERNORM, for a second backward
                          * whose reduction runs on the second stream while the first's may */
    SG_SLOT_COUNT
} sg_scratch_slot;

/* Slots of sg_ctx_ext: per-context host caches of the CUDA ops, freed with the context. */
typedef enum sg_ext_slot {
    SG_EXT_LINEAR = 0,  /* ops/linear_cuda.cu: cuBLASLt matmul plans by shape */
    SG_EXT_ATTENTION,   /* ops/attention_cuda.cu: the cuBLAS handle of the batched GEMMs */
    SG_EXT_CONV,        /* ops/conv_cuda.cu: the cuDNN handle of the convolutions */
    SG_EXT_COUNT
} sg_ext_slot;

/* An observer of destroyed tensors (sg_ctx_set_tensor_hook). */
typedef void (*sg_tensor_hook_fn)(void *user, const sg_tensor *t);

struct sg_ctx {
    sg_backend backend;
    const sg_device_i *dev;
    sg_ctx_options opts;
    char device_name[320];
    char msg[1024];          /* last error */
    uint64_t launches;       /* kernels and library matmuls queued */
    sg_work work;            /* the ops' work asked for (sg_ctx_work) */
    sg_pool *default_pool;
    sg_pool *cur_pool;
    sg_pool *pools;          /* every pool, the default first */
    size_t reserved_total;   /* across pools, checked against opts.alloc_limit_bytes */
    void *cuda;              /* struct sg_cuda_state *, CUDA backend only */
    sg_tensor *scratch[SG_SLOT_COUNT];   /* sg_ctx_scratch buffers, by sg_scratch_slot */
    void *ext[SG_EXT_COUNT];             /* per-context caches of the ops, by sg_ext_slot */
    void (*ext_free[SG_EXT_COUNT])(sg_ctx *ctx, void *ext);
    sg_capture cap;
    int cond_depth;          /* conditional bodies running or recording (graph/cond.c) */
    sg_cond_kind cond_kind;  /* the innermost one's kind, for messages */
    const char *module;      /* the module whose work is being queued, for messages */
    /* Destroyed tensors (sg_ctx_set_tensor_hook): an observer (graph/) sees each one. */
    sg_tensor_hook_fn tensor_hook;
    void *tensor_user;
    /* Named ranges (sg_range_push/pop): an observer (the profiler) sees each push and pop. */
    void (*range_hook)(void *user, const char *name, bool push);
    void *range_user;
    /* An observer of each op's call (the profiler's, while it records): told the op's work
     * family as the op is called, before it launches anything (sg_ctx_count_work). */
    void (*work_hook)(void *user, int family);
    void *work_user;
};

/* During capture, fails with SG_ERR_CAPTURE: "<call>: <what> during capture in module 'm'; <hint>",
 * and marks the capture void, so it fails even if the caller ignores the status. Outside
 * capture, SG_OK. */
sg_status sg_capture_forbid(sg_ctx *ctx, const char *call, const char *what, const char *hint);
/* SG_ERR_CAPTURE when a conditional body runs or records (ctx->cond_depth, eagerly too, so
 * that what runs eagerly also captures) and call does what CUDA forbids in one (what: "ran a
 * collective"); marks a capture in progress void. SG_OK otherwise. */
sg_status sg_cond_forbid(sg_ctx *ctx, const char *call, const char *what);
/* Marks a capture in progress void, its reason the message on ctx (the first reason stays):
 * the capture then fails whatever the step returns. Outside capture, nothing. */
void sg_capture_void(sg_ctx *ctx, sg_status why);
/* The call's name for messages: "sg_graph_if", "sg_graph_while", "sg_graph_switch". */
const char *sg_cond_call(sg_cond_kind kind);
/* Runs fn(args) now, or during a CPU capture appends it (args copied) to the plan. */
sg_status sg_cpu_run(sg_ctx *ctx, sg_cpu_thunk fn, const void *args, size_t size);
sg_plan *sg_plan_create(void);
sg_status sg_plan_run(sg_ctx *ctx, const sg_plan *p);
int sg_plan_length(const sg_plan *p);
size_t sg_plan_bytes(const sg_plan *p);
void sg_plan_destroy(sg_plan *p);
/* parent frees child with itself (a conditional entry's bodies); on failure child is freed. */
sg_status sg_plan_adopt(sg_ctx *ctx, sg_plan *parent, sg_plan *child);
/* One observer of destroyed tensors: sg_tensor_destroy calls fn(user, t) first, while t's
 * fields are still valid. graph/ installs it while graphs are alive, so that replay refuses a
 * static input that was destroyed (core knows nothing of graphs). NULL fn: none. */
void sg_ctx_set_tensor_hook(sg_ctx *ctx, sg_tensor_hook_fn fn, void *user);

/* Named host ranges around a step and each module's forward and backward: NVTX ranges (so
 * Nsight Systems shows them by name; CUDA builds), and the context's range hook when one is
 * set (the profiler records them for traces and per-step analysis). Cheap when nobody
 * listens: NVTX without a tool attached is a no-op call. Pops must pair with pushes. */
void sg_range_push(sg_ctx *ctx, const char *name);
void sg_range_pop(sg_ctx *ctx, const char *name);

/* A persistent device buffer of at least `bytes`, zero-filled when (re)allocated, owned by
 * the context: kernels keep reduction partials and "last block done" counters there (a
 * counter must be left at zero by the kernel that uses it). Allocates only on the first call
 * (or when a larger size is asked for): steady-state steps allocate nothing. */
sg_status sg_ctx_scratch(sg_ctx *ctx, sg_scratch_slot slot, size_t bytes, void **out);
/* Registers a cache object for slot, freed by free_fn when the context is destroyed. */
void sg_ctx_set_ext(sg_ctx *ctx, sg_ext_slot slot, void *ext,
                    void (*free_fn)(sg_ctx *ctx, void *ext));
static inline void *sg_ctx_ext(const sg_ctx *ctx, sg_ext_slot slot) { return ctx->ext[slot]; }

static inline void sg_ctx_count_launches(sg_ctx *ctx, int n) { ctx->launches += (uint64_t)n; }
/* An op's work (sg_ctx_work): flops of its products, bytes it must move. */
static inline void sg_ctx_count_work(sg_ctx *ctx, sg_work_family f, double flops, double bytes)
{
    ctx->work.flops[f] += flops, ctx->work.bytes[f] += bytes;
    if (ctx->work_hook) ctx->work_hook(ctx->work_user, (int)f);
}
/* The bytes of up to 8 tensors (NULLs count 0): an op's inputs and outputs. */
double sg_tensors_bytes(const sg_tensor *a, const sg_tensor *b, const sg_tensor *c, const sg_tensor *d,
                        const sg_tensor *e, const sg_tensor *f, const sg_tensor *g, const sg_tensor *h);

/* CUDA state, visible to .cu launchers through these getters (NULL on the CPU backend). */
void *sg_ctx_stream(const sg_ctx *ctx);            /* cudaStream_t */
void *sg_ctx_cublaslt(const sg_ctx *ctx);          /* cublasLtHandle_t */
void *sg_ctx_workspace(const sg_ctx *ctx, size_t *bytes);
int sg_ctx_sm_count(const sg_ctx *ctx);
/* Whether kernels that take it may be launched with programmatic dependent launch (sm_90 and
 * later; the environment variable SG_PDL=0 turns it off, to measure what it gives). */
bool sg_ctx_pdl(const sg_ctx *ctx);
/* Measurement switches read from the environment when the context is created (CUDA contexts;
 * false otherwise): cuBLASLt's BGRADB / DGELU_BGRAD epilogues in the linear backward
 * (STEPGRAPH_BGRAD=1; off by default, measured slower), and graphs instantiated to run each
 * kernel at its captured priority (on unless STEPGRAPH_NODE_PRIORITY=0). */
bool sg_ctx_lt_bgrad(const sg_ctx *ctx);
bool sg_ctx_node_priority(const sg_ctx *ctx);
/* f32 matmuls in TF32 (sg_ctx_options.tf32, or STEPGRAPH_TF32=1 at creation): CUDA contexts. */
bool sg_ctx_tf32(const sg_ctx *ctx);
/* Matmul candidates to time on a shape's first call (sg_ctx_options.gemm_tune, or
 * STEPGRAPH_GEMM_TUNE at creation; 1 there means 16): 0 for none, or 2 to 16. CUDA contexts. */
int sg_ctx_gemm_tune(const sg_ctx *ctx);
#define SG_GEMM_TUNE_MAX 16 /* the most candidates timed (the option's 1 means this many) */
#define SG_GEMM_TUNE_RANGE "expected 0 (off), 1 (up to 16 candidates) or 2 to 16"
/* A second stream for work beside the context's own, with a cuBLASLt workspace of its own
 * (made at context creation unless STEPGRAPH_WGRAD=off; NULL then). sg_ctx_side_fork makes it
 * wait for what the main stream has queued and marks work pending; sg_ctx_side_join makes the
 * main stream wait for what it has queued, if any is pending. Both are events, so they work in
 * eager mode and under stream capture alike (a fork then a join makes a branch of the graph).
 * An op queues work there when sg_ctx_side_use: STEPGRAPH_WGRAD=side, always; defer (the
 * default), only inside a region, sg_ctx_side_enter to sg_ctx_side_leave (which joins), that a
 * built-in module's backward opens around its ops because it knows which of its buffers they
 * write. The op joins before it returns, unless sg_ctx_side_deferred (defer, inside a region):
 * then the region's end joins. Outside a region (a user's own module, a direct call), defer
 * queues nothing on the second stream. */
void *sg_ctx_side_stream(const sg_ctx *ctx); /* cudaStream_t, or NULL */
void *sg_ctx_side_workspace(const sg_ctx *ctx);
sg_status sg_ctx_side_fork(sg_ctx *ctx);
sg_status sg_ctx_side_join(sg_ctx *ctx);
bool sg_ctx_side_use(const sg_ctx *ctx);
bool sg_ctx_side_deferred(const sg_ctx *ctx);
void sg_ctx_side_enter(sg_ctx *ctx);
sg_status sg_ctx_side_leave(sg_ctx *ctx);
/* The end of an op's work on the second stream (side: it queued some, after a fork): joins
 * unless sg_ctx_side_deferred, and on failure too, so that no branch is left open. Returns st,
 * or the join's failure when st is SG_OK. */
sg_status sg_ctx_side_end(sg_ctx *ctx, bool side, sg_status st);
/* Buffers that unjoined work on the second stream may still read: bits an op marks when it
 * queues such work (SG_SIDE_*), all cleared by a join. An op that would write one first joins. */
enum { SG_SIDE_LN_A = 1u, SG_SIDE_LN_B = 2u };
unsigned sg_ctx_side_busy(const sg_ctx *ctx);
void sg_ctx_side_mark(sg_ctx *ctx, unsigned bits);

/* Turns a CUDA runtime error code (an int, so C code need not include CUDA headers) into a
 * status with a message naming the call, file and line. */
sg_status sg_cuda_status(const sg_ctx *ctx, int err, const char *call, const char *file, int line);
sg_status sg_cublas_status(const sg_ctx *ctx, int err, const char *call, const char *file,
                           int line);
#define SG_CUDA_CHECK(ctx, call)                                                              \
    do {                                                                                      \
        int sg_e_ = (int)(call);                                                              \
        if (sg_e_ != 0) return sg_cuda_status((ctx), sg_e_, #call, __FILE__, __LINE__);       \
    } while (0)
#define SG_CUBLAS_CHECK(ctx, call)                                                            \
    do {                                                                                      \
        int sg_e_ = (int)(call);                                                              \
        if (sg_e_ != 0) return sg_cublas_status((ctx), sg_e_, #call, __FILE__, __LINE__);     \
    } while (0)
/* After a kernel launch: the launch error, if any, as "<what> launch failed: <CUDA's error> at
 * file:line". what names the kernel and must be a string literal ("ln_forward_kernel"). */
#define SG_CUDA_CHECK_LAUNCH(ctx, what)                                                       \
    do {                                                                                      \
        int sg_e_ = sg_cuda_last_error();                                                     \
        if (sg_e_ != 0)                                                                       \
            return sg_cuda_status((ctx), sg_e_, what " launch", __FILE__, __LINE__);          \
    } while (0)
int sg_cuda_last_error(void);

/* Runs a CUDA dispatch expression in CUDA builds; a clear error in CPU-only builds, so op
 * entry points need no #ifdef of their own. */
#ifdef SG_HAVE_CUDA
#define SG_CUDA_DISPATCH(ctx, expr) (expr)
#else
#define SG_CUDA_DISPATCH(ctx, expr)                                                           \
    sg_fail((ctx), SG_ERR_BACKEND, "%s: this build of stepgraph has no CUDA backend",       \
            __func__)
#endif

/* ---- tensors ---- */

struct sg_tensor {
    sg_ctx *ctx;
    sg_dtype dtype;
    int ndim;
    int64_t shape[SG_MAX_DIMS];
    int64_t numel;
    void *data;
    sg_pool *pool;           /* NULL for views */
    sg_block *block;         /* NULL for views */
    const sg_tensor *base;   /* views: the tensor they point into */
    int64_t cap_rows;        /* rows its storage holds: sg_tensor_set_rows may use fewer */
    int64_t cap_numel;       /* elements its storage holds: sg_tensor_set_shape may use fewer */
    char name[64];
};

/* Element access for CPU reference code: every dtype read as double, written from double. */
double sg_bf16_to_double(uint16_t h);
uint16_t sg_double_to_bf16(double v);  /* round to nearest even */

static inline double sg_ld(const sg_tensor *t, int64_t i)
{
    switch (t->dtype) {
    case SG_DTYPE_F32: return ((const float *)t->data)[i];
    case SG_DTYPE_F64: return ((const double *)t->data)[i];
    case SG_DTYPE_BF16: return sg_bf16_to_double(((const uint16_t *)t->data)[i]);
    case SG_DTYPE_I32: return ((const int32_t *)t->data)[i];
    }
    return 0.0;
}

static inline void sg_st(sg_tensor *t, int64_t i, double v)
{
    switch (t->dtype) {
    case SG_DTYPE_F32: ((float *)t->data)[i] = (float)v; break;
    case SG_DTYPE_F64: ((double *)t->data)[i] = v; break;
    case SG_DTYPE_BF16: ((uint16_t *)t->data)[i] = sg_double_to_bf16(v); break;
    case SG_DTYPE_I32: ((int32_t *)t->data)[i] = (int32_t)v; break;
    }
}

/* A tensor with a shape and no storage (data NULL; sg_tensor_destroy frees the struct), and
 * binding one into base at byte_offset once base exists: activation recompute (nn/recompute.c)
 * places the buffers of every region in one arena sized when the model is built. */
sg_status sg_tensor_unbound(sg_ctx *ctx, sg_dtype dt, int ndim, const int64_t *shape, const char *name,
                            sg_tensor **out);
void sg_tensor_bind(sg_tensor *t, const sg_tensor *base, size_t byte_offset);

/* ---- numbers a user writes in names and metadata (file.c) ---- */

/* The n characters at s as a whole number: decimal digits only (no sign, space, fraction or
 * leading zero), at most max. False otherwise (n == 0 included). */
bool sg_parse_decimal(const char *s, size_t n, int64_t max, int64_t *out);

/* ---- files a user names (file.c) ---- */

/* What mode m is ("a directory", "a FIFO (named pipe)", ...), for messages. */
const char *sg_file_kind(mode_t m);
/* Opens path for reading without blocking (a FIFO with no writer would block a plain open)
 * and refuses anything but a regular file (SG_ERR_INVALID naming what it is, fn first) before
 * a byte is read; then clears O_NONBLOCK. *fd: the descriptor (the caller closes it); *size:
 * the file's size. */
sg_status sg_file_open_regular(sg_ctx *ctx, const char *fn, const char *path, int *fd, int64_t *size);

/* Outputs must not share bytes with anything else a call reads or writes (kernels read inputs
 * after writing outputs, and other threads read what one thread wrote). sg_check_not_overlapping:
 * one output against one other tensor (NULLs pass). sg_check_disjoint: the first nout of ts[]
 * are outputs, each checked against every other of the n. The message names both. */
sg_status sg_check_not_overlapping(const sg_ctx *ctx, const char *fn, const char *wout,
                                   const sg_tensor *out, const char *wother, const sg_tensor *other);
sg_status sg_check_disjoint(const sg_ctx *ctx, const char *fn, int nout, int n,
                            const char *const *names, const sg_tensor *const *ts);

/* CPU reference helpers: a tensor's elements as doubles (f64 tensors in place, *owned NULL;
 * others converted into a new buffer the caller frees via *owned; NULL when out of memory), and
 * doubles stored back at element offset off, rounded to the tensor's dtype. */
const double *sg_cpu_as_f64(const sg_tensor *t, double **owned);
void sg_cpu_store(sg_tensor *t, int64_t off, const double *v, int64_t n);

/* Argument checks for op entry points; each fails with a message naming fn and the tensor. */
sg_status sg_check_tensor(const sg_ctx *ctx, const char *fn, const char *what, const sg_tensor *t);
sg_status sg_check_dtype(const sg_ctx *ctx, const char *fn, const char *what, const sg_tensor *t,
                         sg_dtype want);
/* Exactly n elements (any shape) of dtype want: a flag, a scalar, a small state vector. A
 * wrong dtype fails as sg_check_dtype; a wrong count with SG_ERR_SHAPE naming the tensor by
 * role and name, its shape and dtype, and the count expected; note, when not NULL, says what
 * the elements hold. */
sg_status sg_check_count(const sg_ctx *ctx, const char *fn, const char *what, const sg_tensor *t,
                         sg_dtype want, int64_t n, const char *note);
/* Float dtypes the backend computes in: F32 (both), F64 (CPU), BF16 where supported. */
sg_status sg_check_float(const sg_ctx *ctx, const char *fn, const char *what, const sg_tensor *t);
/* As sg_check_float, and BF16 too (ops with bf16 kernels: mixed precision). */
sg_status sg_check_float_or_bf16(const sg_ctx *ctx, const char *fn, const char *what, const sg_tensor *t);
sg_status sg_check_same_shape(const sg_ctx *ctx, const char *fn, const char *wa,
                              const sg_tensor *a, const char *wb, const sg_tensor *b);
/* The same shape, any dtypes (SG_ERR_SHAPE naming both). */
sg_status sg_check_same_dims(const sg_ctx *ctx, const char *fn, const char *wa,
                             const sg_tensor *a, const char *wb, const sg_tensor *b);
sg_status sg_check_shape2(const sg_ctx *ctx, const char *fn, const char *what, const sg_tensor *t,
                          int64_t rows, int64_t cols);
/* "(32, 512) f32" into buf. */
const char *sg_shape_str(const sg_tensor *t, char *buf, size_t n);

/* Makes t use its first `rows` rows (dimension 0) of the storage it was created with: one set
 * of buffers serves every batch bucket. No allocation, no device work. */
sg_status sg_tensor_set_rows(sg_tensor *t, int64_t rows);
/* Gives t any shape (ndim 1..4) whose elements fit the storage it was created with (its first
 * elements, row-major): (B, H, T, T) attention probabilities reused as (B, H, Tb, Tb) for a
 * shorter sequence. SG_ERR_SHAPE, naming the tensor, when they do not fit. No allocation, no
 * device work. */
sg_status sg_tensor_set_shape(sg_tensor *t, int ndim, const int64_t *shape);

/* Writes nbytes (<= 64) from host memory into t's storage at byte offset off, as a
 * stream-ordered device write (a kernel on CUDA): no host sync, safe inside capture. */
sg_status sg_tensor_write_small(sg_tensor *t, size_t off, const void *src, size_t nbytes);

#ifdef SG_HAVE_CUDA
/* core/tensor_cuda.cu launchers. */
sg_status sg_fill_cuda(sg_ctx *ctx, sg_tensor *t, double value);
sg_status sg_add_scalar_cuda(sg_ctx *ctx, sg_tensor *t, double value);
sg_status sg_convert_cuda(sg_ctx *ctx, sg_tensor *dst, const sg_tensor *src);
sg_status sg_write_small_cuda(sg_ctx *ctx, void *dst, const void *src, size_t nbytes);
#endif

#ifdef __cplusplus
}
#endif
#endif /* SG_CORE_H */
