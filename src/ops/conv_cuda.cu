/* conv_cuda.cu: the 2-D convolution on cuDNN 9 (its legacy convolution API), channels last, f32
 * or bf16, plus stepgraph's bias kernels. Deterministic: every algorithm is one cuDNN reports
 * as deterministic, and the bias gradient sums in a fixed order (no float atomics), so eager
 * steps and graph replays agree bit for bit.
 *
 * Descriptors: x, dx, y, dy are 4-D tensors in CUDNN_TENSOR_NHWC, w, dw a CUDNN_TENSOR_NHWC
 * filter (Cout, KH, KW, Cin/groups), cross-correlation (as PyTorch), compute type f32,
 * cudnnSetConvolutionGroupCount for groups (depthwise included).
 *
 * Math type: f32 runs CUDNN_FMA_MATH: true fp32. CUDNN_DEFAULT_MATH would let cuDNN use TF32
 * tensor cores on Ampere and later (10-bit mantissa inputs), which the f32 contract rules out
 * (the linear layer's cuBLAS runs no TF32 either). bf16 runs CUDNN_TENSOR_OP_MATH (bf16
 * products, f32 accumulation), or the math type the chosen algorithm reports.
 *
 * The plan (sg_conv2d_plan_cuda, once): one convolution descriptor per pass (forward, backward
 * data, backward filter), since each pass's algorithm carries its own math type. Each pass
 * takes the fastest algorithm that succeeds on the shape, is CUDNN_DETERMINISTIC, needs at most
 * SG_CONV_WORKSPACE_MAX bytes and (f32) no tensor cores, and whose workspace size cuDNN then
 * confirms under the pass's math type. "Fastest" is cuDNN's heuristic ranking
 * (cudnnGet*Algorithm_v7) for ungrouped convolutions, and measured for grouped ones
 * (depthwise), where the heuristic's first deterministic bf16 pick ran one kernel per group
 * (bench/RESULTS.md): cudnnFind*AlgorithmEx on scratch tensors of the plan's shapes, at most
 * CONV_MEASURE_WS bytes of workspace, when the model is built, as PyTorch's cudnn.benchmark.
 * Every choice is remembered per context for its shape, so every plan of one shape in a context
 * (an eager model and its graphed twin in verify) runs the same algorithms and agrees bit for
 * bit. Measured choices can differ between processes (timings vary), and with them the last
 * bits. STEPGRAPH_CONV_ALGO=heuristic ranks every shape by the heuristic (the same choice in
 * every process), =measure measures every shape (slower on ResNet-50: bench/RESULTS.md),
 * =grouped is the default. One workspace of the most any pass needs (or the bias
 * gradient's partials, if more) is allocated from the context's current pool; the runs share
 * it (one stream: they never overlap) and allocate nothing.
 *
 * Depthwise convolutions (groups = Cin = Cout): each pass may run stepgraph's kernels
 * (dwconv_cuda.cu) instead, as STEPGRAPH_DEPTHWISE says (conv.h): =own all three, =cudnn none,
 * =auto (the default) whichever ran faster when the plan was made: after the cuDNN choice
 * above, both run on the scratch tensors (one warm-up each, then CONV_RACE_ROUNDS batches of
 * CONV_RACE_REPS runs, alternating, timed with CUDA events; the least batch counts, ties go
 * to ours), and a pass for which cuDNN offers no deterministic algorithm goes to ours. The
 * winners (c->own) are remembered with the algorithms, keyed by the shape and the mode. Ours
 * fuse the bias into the forward (one launch); their weight gradient's partial sums take the
 * plan's workspace (sg_dwconv_workspace_bytes), as db's do.
 *
 * cuDNN handle: one per context, kept in ext slot SG_EXT_CONV, created by the first plan
 * (outside capture); every run of a cuDNN pass binds it to the context's stream first
 * (cudnnSetStream). */
#include "ops/conv.h"

#ifdef SG_HAVE_CUDNN

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <stdlib.h>
#include <string.h>

#include "ops/dtype_cuda.cuh"

#define CONV_THREADS 256
#define CONV_DB_COLS 32                            /* db partial kernel: channels per block ... */
#define CONV_DB_SLICES (CONV_THREADS / CONV_DB_COLS) /* ... and row slices per channel */
#define CONV_DB_ROWS 512                           /* rows (N OH OW positions) per partial */
#define CONV_DB_MAX_PARTS 1024                     /* partials per channel at most */
#define CONV_BIAS_BLOCKS_PER_SM 16                 /* bias add: grid cap (grid-stride beyond) */

/* ---- errors ---- */

static sg_status dnn_status(const sg_ctx *ctx, cudnnStatus_t s, const char *call,
                            const char *file, int line)
{
    return sg_fail(ctx, SG_ERR_CUDA, "%s failed: %s at %s:%d", call, cudnnGetErrorString(s), file,
                   line);
}

#define SG_CUDNN_CHECK(ctx, call)                                                             \
    do {                                                                                      \
        cudnnStatus_t sg_d_ = (call);                                                         \
        if (sg_d_ != CUDNN_STATUS_SUCCESS)                                                    \
            return dnn_status((ctx), sg_d_, #call, __FILE__, __LINE__);                       \
    } while (0)

/* ---- the cuDNN handle ---- */

/* STEPGRAPH_DEPTHWISE: who runs a depthwise convolution's passes (conv.h). Convolutions our
 * kernels do not take are DW_MODE_CUDNN whatever the variable says. */
typedef enum dw_mode { DW_MODE_AUTO, DW_MODE_OWN, DW_MODE_CUDNN } dw_mode;

/* A shape's chosen algorithms, remembered for the context's later plans of that shape (and
 * depthwise mode). */
typedef struct conv_choice {
    sg_dtype dtype;
    int64_t x[4], w[4];
    sg_conv2d_params p;
    dw_mode mode;
    unsigned own;                    /* SG_CONV_OWN_* bits: passes run by dwconv_cuda.cu */
    int fwd, data, filter;           /* the algorithms (of the passes cuDNN runs) */
    cudnnMathType_t fwd_m, data_m, filter_m;
} conv_choice;

/* The convolutions' workspace is the context's, one for every plan: passes run one at a time
 * on the context's stream, so the largest plan's bytes serve all (a workspace per plan made
 * ResNet-50's 53 convolutions hold one each). Plans record what they need; the first pass
 * run after them allocates it (a model's build runs one forward, before any capture). A
 * workspace outgrown by a later model's plans is kept, not freed, until the context goes: a
 * graph captured before may still name it. */
typedef struct conv_dnn {
    cudnnHandle_t handle;
    conv_choice *choices;
    int n_choices, cap_choices;
    size_t ws_need;                  /* the most bytes a plan made so far needs */
    sg_tensor *ws;                   /* the workspace, from the default pool */
    sg_tensor **retired;             /* outgrown workspaces */
    int n_retired;
} conv_dnn;

static void dnn_free(sg_ctx *ctx, void *ext)
{
    conv_dnn *d = (conv_dnn *)ext;
    if (d->handle) cudnnDestroy(d->handle); /* teardown: a failure cannot be acted on */
    sg_tensor_destroy(d->ws);
    for (int i = 0; i < d->n_retired; i++) sg_tensor_destroy(d->retired[i]);
    free(d->retired);
    free(d->choices);
    free(d);
}

/* The shared workspace, grown to what the plans made so far need. */
static sg_status workspace(sg_ctx *ctx, void **out)
{
    conv_dnn *d = (conv_dnn *)sg_ctx_ext(ctx, SG_EXT_CONV);
    if (!d->ws || sg_tensor_nbytes(d->ws) < d->ws_need) {
        if (d->ws) {
            sg_tensor **r = (sg_tensor **)realloc(d->retired, (size_t)(d->n_retired + 1) * sizeof *r);
            if (!r) return sg_fail(ctx, SG_ERR_OOM, "sg_conv2d: out of host memory for the workspace list");
            d->retired = r;
            r[d->n_retired++] = d->ws;
            d->ws = NULL;
        }
        int64_t elems = (int64_t)((d->ws_need + sizeof(float) - 1) / sizeof(float));
        sg_pool *keep = ctx->cur_pool;
        ctx->cur_pool = ctx->default_pool; /* it outlives any graph's pool */
        sg_status st = sg_tensor_create(ctx, SG_DTYPE_F32, 1, &elems, "conv2d workspace", &d->ws);
        ctx->cur_pool = keep;
        SG_TRY(st);
    }
    *out = d->ws->data;
    return SG_OK;
}

/* The context's cuDNN handle: created and cached by the first plan. */
static sg_status dnn_get(sg_ctx *ctx, cudnnHandle_t *out)
{
    conv_dnn *d = (conv_dnn *)sg_ctx_ext(ctx, SG_EXT_CONV);
    if (d) {
        *out = d->handle;
        return SG_OK;
    }
    d = (conv_dnn *)calloc(1, sizeof *d);
    if (!d) return sg_fail(ctx, SG_ERR_OOM, "sg_conv2d_create: out of host memory for cuDNN");
    cudnnStatus_t s = cudnnCreate(&d->handle);
    if (s != CUDNN_STATUS_SUCCESS) {
        free(d);
        return dnn_status(ctx, s, "cudnnCreate", __FILE__, __LINE__);
    }
    sg_ctx_set_ext(ctx, SG_EXT_CONV, d, dnn_free);
    *out = d->handle;
    return SG_OK;
}

/* ---- the plan ---- */

typedef struct conv_plan {
    cudnnHandle_t h;
    cudnnTensorDescriptor_t xd, yd;  /* x and dx; y and dy */
    cudnnFilterDescriptor_t wd;      /* w and dw */
    cudnnConvolutionDescriptor_t fwd_cd, data_cd, filter_cd;
    cudnnConvolutionFwdAlgo_t fwd;
    cudnnConvolutionBwdDataAlgo_t data;
    cudnnConvolutionBwdFilterAlgo_t filter;
    int64_t db_parts, db_rows;       /* bias gradient: partials per channel, rows per partial */
} conv_plan;

void sg_conv2d_free_cuda(sg_conv2d *c)
{
    conv_plan *pl = (conv_plan *)c->cuda;
    if (!pl) return;
    /* Teardown: failures cannot be acted on. */
    if (pl->xd) cudnnDestroyTensorDescriptor(pl->xd);
    if (pl->yd) cudnnDestroyTensorDescriptor(pl->yd);
    if (pl->wd) cudnnDestroyFilterDescriptor(pl->wd);
    if (pl->fwd_cd) cudnnDestroyConvolutionDescriptor(pl->fwd_cd);
    if (pl->data_cd) cudnnDestroyConvolutionDescriptor(pl->data_cd);
    if (pl->filter_cd) cudnnDestroyConvolutionDescriptor(pl->filter_cd);
    free(pl);
    c->cuda = NULL;
    c->ws_bytes = 0;
    c->own = 0;
}

/* The math type a pass starts from (see the file comment). */
static cudnnMathType_t base_math(sg_dtype dt)
{
    return dt == SG_DTYPE_F32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH;
}

/* May a heuristic's candidate run? Deterministic, supported, workspace within the cap, and no
 * tensor cores for f32 (TF32). */
static bool usable(sg_dtype dt, cudnnStatus_t st, cudnnDeterminism_t det, cudnnMathType_t math,
                   size_t memory)
{
    if (st != CUDNN_STATUS_SUCCESS || det != CUDNN_DETERMINISTIC) return false;
    if (memory > SG_CONV_WORKSPACE_MAX) return false;
    if (dt == SG_DTYPE_F32 && (math == CUDNN_TENSOR_OP_MATH ||
                               math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION))
        return false;
    return true;
}

/* The math type a chosen candidate runs under: f32 stays FMA whatever it reports. */
static cudnnMathType_t run_math(sg_dtype dt, cudnnMathType_t reported)
{
    return dt == SG_DTYPE_F32 ? CUDNN_FMA_MATH : reported;
}

static sg_status no_algorithm(sg_ctx *ctx, const sg_conv2d *c, const char *pass, int seen)
{
    return sg_fail(ctx, SG_ERR_UNSUPPORTED,
                   "sg_conv2d_create: cuDNN offers no deterministic %s algorithm for x (%lld, "
                   "%lld, %lld, %lld) w (%lld, %lld, %lld, %lld) %s, stride %dx%d, padding %dx%d, "
                   "dilation %dx%d, groups %d within %zu MiB of workspace (%d candidates)",
                   pass, (long long)c->x_shape[0], (long long)c->x_shape[1],
                   (long long)c->x_shape[2], (long long)c->x_shape[3], (long long)c->w_shape[0],
                   (long long)c->w_shape[1], (long long)c->w_shape[2], (long long)c->w_shape[3],
                   sg_dtype_name(c->dtype), c->p.stride_h, c->p.stride_w, c->p.pad_h, c->p.pad_w,
                   c->p.dil_h, c->p.dil_w, c->p.groups, SG_CONV_WORKSPACE_MAX >> 20, seen);
}

#define CONV_MEASURE_WS ((size_t)64 << 20) /* workspace offered to measured candidates */

/* Scratch tensors of the plan's shapes for cudnnFind*AlgorithmEx (x doubles as dx, y as dy, w
 * as dw), zero-filled, and a workspace; freed (to the context's cache) after the plan. */
typedef struct conv_scratch {
    sg_tensor *x, *w, *y, *ws;
} conv_scratch;

static void scratch_free(conv_scratch *m)
{
    sg_tensor_destroy(m->x), sg_tensor_destroy(m->w), sg_tensor_destroy(m->y), sg_tensor_destroy(m->ws);
}

static sg_status scratch_make(sg_ctx *ctx, const sg_conv2d *c, conv_scratch *m)
{
    int64_t ws_elems = (int64_t)(CONV_MEASURE_WS / sizeof(float));
    SG_TRY(sg_tensor_create(ctx, c->dtype, 4, c->x_shape, "conv2d measure x", &m->x));
    SG_TRY(sg_tensor_create(ctx, c->dtype, 4, c->w_shape, "conv2d measure w", &m->w));
    SG_TRY(sg_tensor_create(ctx, c->dtype, 4, c->y_shape, "conv2d measure y", &m->y));
    SG_TRY(sg_tensor_create(ctx, SG_DTYPE_F32, 1, &ws_elems, "conv2d measure workspace", &m->ws));
    SG_TRY(sg_tensor_fill(m->x, 0.0));
    SG_TRY(sg_tensor_fill(m->w, 0.0));
    return sg_tensor_fill(m->y, 0.0);
}

/* Each pass: the candidates fastest first (measured on scratch tensors when m, else cuDNN's
 * heuristic ranking), then the first candidate usable() admits whose workspace cuDNN confirms
 * under the math type the pass will run with (set on its descriptor). */
static sg_status pick_forward(sg_ctx *ctx, const sg_conv2d *c, conv_plan *pl, const conv_scratch *m, size_t *ws)
{
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int n = 0;
    if (m)
        SG_CUDNN_CHECK(ctx, cudnnFindConvolutionForwardAlgorithmEx(
                                pl->h, pl->xd, sg_tensor_data(m->x), pl->wd, sg_tensor_data(m->w), pl->fwd_cd,
                                pl->yd, sg_tensor_data(m->y), CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, perf,
                                sg_tensor_data(m->ws), CONV_MEASURE_WS));
    else
        SG_CUDNN_CHECK(ctx, cudnnGetConvolutionForwardAlgorithm_v7(
                                pl->h, pl->xd, pl->wd, pl->fwd_cd, pl->yd,
                                CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, perf));
    for (int i = 0; i < n; i++) {
        const cudnnConvolutionFwdAlgoPerf_t *q = &perf[i];
        if (!usable(c->dtype, q->status, q->determinism, q->mathType, q->memory)) continue;
        SG_CUDNN_CHECK(ctx,
                       cudnnSetConvolutionMathType(pl->fwd_cd, run_math(c->dtype, q->mathType)));
        size_t bytes = 0;
        cudnnStatus_t st = cudnnGetConvolutionForwardWorkspaceSize(
            pl->h, pl->xd, pl->wd, pl->fwd_cd, pl->yd, q->algo, &bytes);
        if (st != CUDNN_STATUS_SUCCESS || bytes > SG_CONV_WORKSPACE_MAX) continue;
        pl->fwd = q->algo;
        *ws = bytes;
        return SG_OK;
    }
    return no_algorithm(ctx, c, "forward", n);
}

static sg_status pick_data(sg_ctx *ctx, const sg_conv2d *c, conv_plan *pl, const conv_scratch *m, size_t *ws)
{
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    int n = 0;
    if (m)
        SG_CUDNN_CHECK(ctx, cudnnFindConvolutionBackwardDataAlgorithmEx(
                                pl->h, pl->wd, sg_tensor_data(m->w), pl->yd, sg_tensor_data(m->y), pl->data_cd,
                                pl->xd, sg_tensor_data(m->x), CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, perf,
                                sg_tensor_data(m->ws), CONV_MEASURE_WS));
    else
        SG_CUDNN_CHECK(ctx, cudnnGetConvolutionBackwardDataAlgorithm_v7(
                                pl->h, pl->wd, pl->yd, pl->data_cd, pl->xd,
                                CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, perf));
    for (int i = 0; i < n; i++) {
        const cudnnConvolutionBwdDataAlgoPerf_t *q = &perf[i];
        if (!usable(c->dtype, q->status, q->determinism, q->mathType, q->memory)) continue;
        SG_CUDNN_CHECK(ctx,
                       cudnnSetConvolutionMathType(pl->data_cd, run_math(c->dtype, q->mathType)));
        size_t bytes = 0;
        cudnnStatus_t st = cudnnGetConvolutionBackwardDataWorkspaceSize(
            pl->h, pl->wd, pl->yd, pl->data_cd, pl->xd, q->algo, &bytes);
        if (st != CUDNN_STATUS_SUCCESS || bytes > SG_CONV_WORKSPACE_MAX) continue;
        pl->data = q->algo;
        *ws = bytes;
        return SG_OK;
    }
    return no_algorithm(ctx, c, "backward-data", n);
}

static sg_status pick_filter(sg_ctx *ctx, const sg_conv2d *c, conv_plan *pl, const conv_scratch *m, size_t *ws)
{
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    int n = 0;
    if (m)
        SG_CUDNN_CHECK(ctx, cudnnFindConvolutionBackwardFilterAlgorithmEx(
                                pl->h, pl->xd, sg_tensor_data(m->x), pl->yd, sg_tensor_data(m->y), pl->filter_cd,
                                pl->wd, sg_tensor_data(m->w), CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, perf,
                                sg_tensor_data(m->ws), CONV_MEASURE_WS));
    else
        SG_CUDNN_CHECK(ctx, cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                                pl->h, pl->xd, pl->yd, pl->filter_cd, pl->wd,
                                CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, perf));
    for (int i = 0; i < n; i++) {
        const cudnnConvolutionBwdFilterAlgoPerf_t *q = &perf[i];
        if (!usable(c->dtype, q->status, q->determinism, q->mathType, q->memory)) continue;
        SG_CUDNN_CHECK(ctx,
                       cudnnSetConvolutionMathType(pl->filter_cd, run_math(c->dtype, q->mathType)));
        size_t bytes = 0;
        cudnnStatus_t st = cudnnGetConvolutionBackwardFilterWorkspaceSize(
            pl->h, pl->xd, pl->yd, pl->filter_cd, pl->wd, q->algo, &bytes);
        if (st != CUDNN_STATUS_SUCCESS || bytes > SG_CONV_WORKSPACE_MAX) continue;
        pl->filter = q->algo;
        *ws = bytes;
        return SG_OK;
    }
    return no_algorithm(ctx, c, "backward-filter", n);
}

static sg_status conv_desc(sg_ctx *ctx, const sg_conv2d *c, cudnnConvolutionDescriptor_t *cd)
{
    SG_CUDNN_CHECK(ctx, cudnnCreateConvolutionDescriptor(cd));
    const sg_conv2d_params *p = &c->p;
    SG_CUDNN_CHECK(ctx, cudnnSetConvolution2dDescriptor(*cd, p->pad_h, p->pad_w, p->stride_h,
                                                        p->stride_w, p->dil_h, p->dil_w,
                                                        CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    SG_CUDNN_CHECK(ctx, cudnnSetConvolutionGroupCount(*cd, p->groups));
    SG_CUDNN_CHECK(ctx, cudnnSetConvolutionMathType(*cd, base_math(c->dtype)));
    return SG_OK;
}

/* ---- one pass on given buffers: the plan's cuDNN algorithm, or ours when own ---- */

/* y = x (*) w: written (beta 0), no bias. ws: wsb bytes of workspace. */
static sg_status run_forward(sg_ctx *ctx, const sg_conv2d *c, const conv_plan *pl, bool own,
                             const void *x, const void *w, void *y, void *ws, size_t wsb)
{
    if (own) return sg_dwconv_forward_cuda(ctx, c, x, w, NULL, y);
    const float one = 1.f, zero = 0.f; /* f32 scaling factors for f32 and bf16 data alike */
    SG_CUDNN_CHECK(ctx, cudnnConvolutionForward(pl->h, &one, pl->xd, x, pl->wd, w, pl->fwd_cd,
                                                pl->fwd, ws, wsb, &zero, pl->yd, y));
    return SG_OK;
}

static sg_status run_data(sg_ctx *ctx, const sg_conv2d *c, const conv_plan *pl, bool own,
                          const void *w, const void *dy, void *dx, void *ws, size_t wsb)
{
    if (own) return sg_dwconv_backward_data_cuda(ctx, c, w, dy, dx);
    const float one = 1.f, zero = 0.f;
    SG_CUDNN_CHECK(ctx, cudnnConvolutionBackwardData(pl->h, &one, pl->wd, w, pl->yd, dy,
                                                     pl->data_cd, pl->data, ws, wsb, &zero,
                                                     pl->xd, dx));
    return SG_OK;
}

static sg_status run_filter(sg_ctx *ctx, const sg_conv2d *c, const conv_plan *pl, bool own,
                            const void *x, const void *dy, void *dw, void *ws, size_t wsb)
{
    if (own) return sg_dwconv_backward_filter_cuda(ctx, c, x, dy, dw, ws, wsb);
    const float one = 1.f, zero = 0.f;
    SG_CUDNN_CHECK(ctx, cudnnConvolutionBackwardFilter(pl->h, &one, pl->xd, x, pl->yd, dy,
                                                       pl->filter_cd, pl->filter, ws, wsb, &zero,
                                                       pl->wd, dw));
    return SG_OK;
}

/* ---- choosing ---- */

static bool same_shape(const conv_choice *k, const sg_conv2d *c, dw_mode mode)
{
    return k->dtype == c->dtype && k->mode == mode && !memcmp(k->x, c->x_shape, sizeof k->x) &&
           !memcmp(k->w, c->w_shape, sizeof k->w) && !memcmp(&k->p, &c->p, sizeof k->p);
}

/* A remembered choice: which passes are ours, and for cuDNN's passes the algorithm, its math
 * type on its descriptor and its workspace (0 for ours: the plan adds theirs). */
static sg_status reuse(sg_ctx *ctx, sg_conv2d *c, const conv_choice *k, conv_plan *pl,
                       size_t *wf, size_t *wd, size_t *wfl)
{
    c->own = k->own;
    *wf = *wd = *wfl = 0;
    pl->fwd = (cudnnConvolutionFwdAlgo_t)k->fwd;
    pl->data = (cudnnConvolutionBwdDataAlgo_t)k->data;
    pl->filter = (cudnnConvolutionBwdFilterAlgo_t)k->filter;
    if (!(k->own & SG_CONV_OWN_FWD)) {
        SG_CUDNN_CHECK(ctx, cudnnSetConvolutionMathType(pl->fwd_cd, k->fwd_m));
        SG_CUDNN_CHECK(ctx, cudnnGetConvolutionForwardWorkspaceSize(pl->h, pl->xd, pl->wd, pl->fwd_cd, pl->yd,
                                                                    pl->fwd, wf));
    }
    if (!(k->own & SG_CONV_OWN_DATA)) {
        SG_CUDNN_CHECK(ctx, cudnnSetConvolutionMathType(pl->data_cd, k->data_m));
        SG_CUDNN_CHECK(ctx, cudnnGetConvolutionBackwardDataWorkspaceSize(pl->h, pl->wd, pl->yd, pl->data_cd,
                                                                         pl->xd, pl->data, wd));
    }
    if (!(k->own & SG_CONV_OWN_FILTER)) {
        SG_CUDNN_CHECK(ctx, cudnnSetConvolutionMathType(pl->filter_cd, k->filter_m));
        SG_CUDNN_CHECK(ctx, cudnnGetConvolutionBackwardFilterWorkspaceSize(pl->h, pl->xd, pl->yd, pl->filter_cd,
                                                                           pl->wd, pl->filter, wfl));
    }
    return SG_OK;
}

/* STEPGRAPH_DEPTHWISE, read when a depthwise plan is made. */
static sg_status depthwise_mode(sg_ctx *ctx, dw_mode *mode)
{
    const char *v = getenv("STEPGRAPH_DEPTHWISE");
    if (!v || !v[0] || !strcmp(v, "auto"))
        *mode = DW_MODE_AUTO;
    else if (!strcmp(v, "own"))
        *mode = DW_MODE_OWN;
    else if (!strcmp(v, "cudnn"))
        *mode = DW_MODE_CUDNN;
    else
        return sg_fail(ctx, SG_ERR_INVALID,
                       "sg_conv2d_create: STEPGRAPH_DEPTHWISE is '%s': expected 'auto' (the "
                       "default), 'own' or 'cudnn'",
                       v);
    return SG_OK;
}

#define CONV_RACE_ROUNDS 3 /* auto: timed batches per candidate (the least counts) ... */
#define CONV_RACE_REPS 3   /* ... of this many runs each */

/* Pass `pass` (an SG_CONV_OWN_* bit) on the scratch tensors (x doubles as dx, y as dy, w as
 * dw). */
static sg_status run_scratch(sg_ctx *ctx, const sg_conv2d *c, const conv_plan *pl, unsigned pass,
                             bool own, const conv_scratch *m, void *ws, size_t wsb)
{
    void *x = sg_tensor_data(m->x), *w = sg_tensor_data(m->w), *y = sg_tensor_data(m->y);
    if (pass == SG_CONV_OWN_FWD) return run_forward(ctx, c, pl, own, x, w, y, ws, wsb);
    if (pass == SG_CONV_OWN_DATA) return run_data(ctx, c, pl, own, w, y, x, ws, wsb);
    return run_filter(ctx, c, pl, own, x, y, w, ws, wsb);
}

/* Milliseconds CONV_RACE_REPS back-to-back runs of a pass take on the stream. */
static sg_status time_batch(sg_ctx *ctx, const sg_conv2d *c, const conv_plan *pl, unsigned pass,
                            bool own, const conv_scratch *m, void *ws, size_t wsb,
                            cudaEvent_t e0, cudaEvent_t e1, float *ms)
{
    cudaStream_t st = (cudaStream_t)sg_ctx_stream(ctx);
    SG_CUDA_CHECK(ctx, cudaEventRecord(e0, st));
    for (int i = 0; i < CONV_RACE_REPS; i++) SG_TRY(run_scratch(ctx, c, pl, pass, own, m, ws, wsb));
    SG_CUDA_CHECK(ctx, cudaEventRecord(e1, st));
    SG_CUDA_CHECK(ctx, cudaEventSynchronize(e1));
    SG_CUDA_CHECK(ctx, cudaEventElapsedTime(ms, e0, e1));
    return SG_OK;
}

/* For each pass in `passes`: ours against cuDNN's chosen algorithm; *won: the passes ours ran
 * no slower. */
static sg_status race_with(sg_ctx *ctx, const sg_conv2d *c, const conv_plan *pl, unsigned passes,
                           const conv_scratch *m, void *ws, size_t wsb, cudaEvent_t e0,
                           cudaEvent_t e1, unsigned *won)
{
    *won = 0;
    for (unsigned pass = SG_CONV_OWN_FWD; pass <= SG_CONV_OWN_FILTER; pass <<= 1) {
        if (!(passes & pass)) continue;
        float best[2] = {3e38f, 3e38f}; /* cuDNN, ours */
        for (int k = 0; k < 2; k++) SG_TRY(run_scratch(ctx, c, pl, pass, k == 1, m, ws, wsb));
        for (int r = 0; r < CONV_RACE_ROUNDS; r++)
            for (int k = 0; k < 2; k++) {
                float ms = 0;
                SG_TRY(time_batch(ctx, c, pl, pass, k == 1, m, ws, wsb, e0, e1, &ms));
                if (ms < best[k]) best[k] = ms;
            }
        if (best[1] <= best[0]) *won |= pass;
    }
    return SG_OK;
}

/* The race's workspace (the scratch's, or a larger one: ours or cuDNN's heuristic fallback may
 * want more) and events, made and released around race_with. need: the most any candidate
 * takes. */
static sg_status race(sg_ctx *ctx, const sg_conv2d *c, const conv_plan *pl, unsigned passes,
                      const conv_scratch *m, size_t need, unsigned *won)
{
    *won = 0;
    if (!passes) return SG_OK;
    sg_tensor *big = NULL;
    void *ws = sg_tensor_data(m->ws);
    size_t wsb = sg_tensor_nbytes(m->ws);
    if (need > wsb) {
        int64_t elems = (int64_t)((need + sizeof(float) - 1) / sizeof(float));
        SG_TRY(sg_tensor_create(ctx, SG_DTYPE_F32, 1, &elems, "conv2d race workspace", &big));
        ws = sg_tensor_data(big), wsb = sg_tensor_nbytes(big);
    }
    cudaEvent_t e0 = NULL, e1 = NULL;
    sg_status st = SG_OK;
    int err = cudaEventCreate(&e0);
    if (!err) err = cudaEventCreate(&e1);
    if (err)
        st = sg_cuda_status(ctx, err, "cudaEventCreate", __FILE__, __LINE__);
    else
        st = race_with(ctx, c, pl, passes, m, ws, wsb, e0, e1, won);
    /* Release (failures cannot be acted on); the stream is idle when race_with returns OK. */
    if (st != SG_OK) cudaStreamSynchronize((cudaStream_t)sg_ctx_stream(ctx));
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    sg_tensor_destroy(big);
    return st;
}

/* The passes' algorithms: the context's earlier choice for this shape (and depthwise mode),
 * else chosen now and remembered. cuDNN's (measured unless STEPGRAPH_CONV_ALGO=heuristic) for
 * every pass not ours; ours (a depthwise plan) for all under STEPGRAPH_DEPTHWISE=own, for those
 * that won the race (or cuDNN has no algorithm for) under auto. */
static sg_status choose(sg_ctx *ctx, sg_conv2d *c, conv_plan *pl, size_t *wf, size_t *wd, size_t *wfl)
{
    conv_dnn *d = (conv_dnn *)sg_ctx_ext(ctx, SG_EXT_CONV);
    dw_mode mode = DW_MODE_CUDNN;
    if (sg_dwconv_supported(c)) SG_TRY(depthwise_mode(ctx, &mode));
    for (int i = 0; i < d->n_choices; i++)
        if (same_shape(&d->choices[i], c, mode)) return reuse(ctx, c, &d->choices[i], pl, wf, wd, wfl);
    const char *how = getenv("STEPGRAPH_CONV_ALGO");
    if (how && how[0] && strcmp(how, "heuristic") && strcmp(how, "measure") && strcmp(how, "grouped"))
        return sg_fail(ctx, SG_ERR_INVALID, "sg_conv2d_create: STEPGRAPH_CONV_ALGO is '%s': expected 'grouped' (the "
                       "default), 'measure' or 'heuristic'", how);
    unsigned own = 0;
    *wf = *wd = *wfl = 0;
    if (mode == DW_MODE_OWN) {
        own = SG_CONV_OWN_ALL; /* no cuDNN pass: nothing to choose */
    } else {
        bool measure = how && !strcmp(how, "measure") ? true
                       : how && !strcmp(how, "heuristic") ? false
                       : c->p.groups > 1; /* grouped (depthwise): the heuristic's first pick can run per group */
        const bool racing = mode == DW_MODE_AUTO;
        conv_scratch m = {0};
        SG_CUDNN_CHECK(ctx, cudnnSetStream(pl->h, (cudaStream_t)sg_ctx_stream(ctx))); /* after the scratch's fills */
        sg_status st = measure || racing ? scratch_make(ctx, c, &m) : SG_OK;
        /* A pass with no usable candidate within the measuring workspace falls back to the
         * ranking; with none there either, to ours when racing. */
        const conv_scratch *mp = measure ? &m : NULL;
        if (st == SG_OK && (st = pick_forward(ctx, c, pl, mp, wf)) == SG_ERR_UNSUPPORTED && mp)
            st = pick_forward(ctx, c, pl, NULL, wf);
        if (st == SG_ERR_UNSUPPORTED && racing) st = SG_OK, own |= SG_CONV_OWN_FWD, *wf = 0;
        if (st == SG_OK && (st = pick_data(ctx, c, pl, mp, wd)) == SG_ERR_UNSUPPORTED && mp)
            st = pick_data(ctx, c, pl, NULL, wd);
        if (st == SG_ERR_UNSUPPORTED && racing) st = SG_OK, own |= SG_CONV_OWN_DATA, *wd = 0;
        if (st == SG_OK && (st = pick_filter(ctx, c, pl, mp, wfl)) == SG_ERR_UNSUPPORTED && mp)
            st = pick_filter(ctx, c, pl, NULL, wfl);
        if (st == SG_ERR_UNSUPPORTED && racing) st = SG_OK, own |= SG_CONV_OWN_FILTER, *wfl = 0;
        if (st == SG_OK && racing) {
            size_t need = sg_dwconv_workspace_bytes(c);
            if (*wf > need) need = *wf;
            if (*wd > need) need = *wd;
            if (*wfl > need) need = *wfl;
            unsigned won = 0;
            st = race(ctx, c, pl, SG_CONV_OWN_ALL & ~own, &m, need, &won);
            own |= won;
            if (won & SG_CONV_OWN_FWD) *wf = 0;
            if (won & SG_CONV_OWN_DATA) *wd = 0;
            if (won & SG_CONV_OWN_FILTER) *wfl = 0;
        }
        /* Find and the race synchronise the stream; the scratch is idle when they return. */
        scratch_free(&m);
        SG_TRY(st);
    }
    c->own = own;
    if (d->n_choices == d->cap_choices) {
        int cap = d->cap_choices ? 2 * d->cap_choices : 16;
        conv_choice *g = (conv_choice *)realloc(d->choices, (size_t)cap * sizeof *g);
        if (!g) return sg_fail(ctx, SG_ERR_OOM, "sg_conv2d_create: out of host memory for the algorithm cache");
        d->choices = g, d->cap_choices = cap;
    }
    conv_choice *k = &d->choices[d->n_choices++];
    memset(k, 0, sizeof *k);
    k->dtype = c->dtype;
    memcpy(k->x, c->x_shape, sizeof k->x), memcpy(k->w, c->w_shape, sizeof k->w), memcpy(&k->p, &c->p, sizeof k->p);
    k->mode = mode, k->own = own;
    k->fwd = pl->fwd, k->data = pl->data, k->filter = pl->filter;
    SG_CUDNN_CHECK(ctx, cudnnGetConvolutionMathType(pl->fwd_cd, &k->fwd_m));
    SG_CUDNN_CHECK(ctx, cudnnGetConvolutionMathType(pl->data_cd, &k->data_m));
    SG_CUDNN_CHECK(ctx, cudnnGetConvolutionMathType(pl->filter_cd, &k->filter_m));
    return SG_OK;
}

/* On failure the caller (conv.c) frees what was made, through sg_conv2d_free_cuda. */
extern "C" sg_status sg_conv2d_plan_cuda(sg_ctx *ctx, sg_conv2d *c)
{
    conv_plan *pl = (conv_plan *)calloc(1, sizeof *pl);
    if (!pl) return sg_fail(ctx, SG_ERR_OOM, "sg_conv2d_create: out of host memory for the plan");
    c->cuda = pl;
    SG_TRY(dnn_get(ctx, &pl->h));

    const cudnnDataType_t dt = c->dtype == SG_DTYPE_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
    const int64_t *xs = c->x_shape, *ws = c->w_shape, *ys = c->y_shape;
    SG_CUDNN_CHECK(ctx, cudnnCreateTensorDescriptor(&pl->xd));
    SG_CUDNN_CHECK(ctx, cudnnCreateTensorDescriptor(&pl->yd));
    SG_CUDNN_CHECK(ctx, cudnnCreateFilterDescriptor(&pl->wd));
    /* (n, c, h, w) arguments, channels-last storage. */
    SG_CUDNN_CHECK(ctx, cudnnSetTensor4dDescriptor(pl->xd, CUDNN_TENSOR_NHWC, dt, (int)xs[0],
                                                   (int)xs[3], (int)xs[1], (int)xs[2]));
    SG_CUDNN_CHECK(ctx, cudnnSetTensor4dDescriptor(pl->yd, CUDNN_TENSOR_NHWC, dt, (int)ys[0],
                                                   (int)ys[3], (int)ys[1], (int)ys[2]));
    SG_CUDNN_CHECK(ctx, cudnnSetFilter4dDescriptor(pl->wd, dt, CUDNN_TENSOR_NHWC, (int)ws[0],
                                                   (int)ws[3], (int)ws[1], (int)ws[2]));
    SG_TRY(conv_desc(ctx, c, &pl->fwd_cd));
    SG_TRY(conv_desc(ctx, c, &pl->data_cd));
    SG_TRY(conv_desc(ctx, c, &pl->filter_cd));

    /* cuDNN must agree with the plan's output shape (conv.c computed it). */
    int on, oc, oh, ow;
    SG_CUDNN_CHECK(ctx, cudnnGetConvolution2dForwardOutputDim(pl->fwd_cd, pl->xd, pl->wd, &on,
                                                              &oc, &oh, &ow));
    if (on != ys[0] || oc != ys[3] || oh != ys[1] || ow != ys[2])
        return sg_fail(ctx, SG_ERR_INVALID,
                       "sg_conv2d_create: cuDNN makes y (%d, %d, %d, %d), the plan (%lld, %lld, "
                       "%lld, %lld)",
                       on, oh, ow, oc, (long long)ys[0], (long long)ys[1], (long long)ys[2],
                       (long long)ys[3]);

    size_t wf = 0, wdata = 0, wfilt = 0;
    SG_TRY(choose(ctx, c, pl, &wf, &wdata, &wfilt));

    /* The bias gradient's partials: db_parts per channel of db_rows rows each. */
    const int64_t M = ys[0] * ys[1] * ys[2], C = ys[3];
    int64_t parts = (M + CONV_DB_ROWS - 1) / CONV_DB_ROWS;
    if (parts > CONV_DB_MAX_PARTS) parts = CONV_DB_MAX_PARTS;
    pl->db_rows = (M + parts - 1) / parts;
    pl->db_parts = (M + pl->db_rows - 1) / pl->db_rows;
    size_t bytes = (size_t)(pl->db_parts * C) * sizeof(float);
    if (wf > bytes) bytes = wf;
    if (wdata > bytes) bytes = wdata;
    if (wfilt > bytes) bytes = wfilt;
    if (c->own & SG_CONV_OWN_FILTER && sg_dwconv_workspace_bytes(c) > bytes)
        bytes = sg_dwconv_workspace_bytes(c); /* our dw's partials */
    bytes = (bytes + 255) / 256 * 256; /* never empty: db's partials at least */
    conv_dnn *d = (conv_dnn *)sg_ctx_ext(ctx, SG_EXT_CONV);
    if (bytes > d->ws_need) d->ws_need = bytes;
    c->ws_bytes = bytes; /* of the context's workspace (see conv_dnn) */
    return SG_OK;
}

/* ---- bias kernels ---- */

/* y (M, C) += b (C), in place after the convolution; f32 math, one rounding to T. */
template <typename T>
__global__ void bias_add_kernel(T *__restrict__ y, const T *__restrict__ b, int64_t n, int64_t C)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = from_f<T>(to_f(y[i]) + to_f(b[i % C]));
}

/* db partials: block (bx, p) sums channels [32 bx, 32 bx + 32) over rows [p rows, (p+1) rows)
 * of dy (M, C): each thread a column over every CONV_DB_SLICES-th row (a warp reads 32
 * consecutive channels of a row), then the slices in order. partials (parts, C), f32. */
template <typename T>
__global__ void db_partial_kernel(const T *__restrict__ dy, float *__restrict__ partials,
                                  int64_t M, int64_t C, int64_t rows)
{
    __shared__ float sh[CONV_DB_SLICES][CONV_DB_COLS];
    const int col = threadIdx.x % CONV_DB_COLS, slice = threadIdx.x / CONV_DB_COLS;
    const int64_t c = (int64_t)blockIdx.x * CONV_DB_COLS + col;
    const int64_t r0 = (int64_t)blockIdx.y * rows, r1 = r0 + rows < M ? r0 + rows : M;
    float s = 0.f;
    if (c < C)
        for (int64_t r = r0 + slice; r < r1; r += CONV_DB_SLICES) s += to_f(dy[r * C + c]);
    sh[slice][col] = s;
    __syncthreads();
    if (slice == 0 && c < C) {
        float t = sh[0][col];
        for (int k = 1; k < CONV_DB_SLICES; k++) t += sh[k][col];
        partials[(int64_t)blockIdx.y * C + c] = t;
    }
}

/* db[c] = the sum of channel c's partials in order, in double, rounded once to T. */
template <typename T>
__global__ void db_reduce_kernel(const float *__restrict__ partials, int64_t parts, int64_t C,
                                 T *__restrict__ db)
{
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double s = 0;
    for (int64_t p = 0; p < parts; p++) s += partials[p * C + c];
    db[c] = from_d<T>(s);
}

template <typename T>
static sg_status bias_add(sg_ctx *ctx, sg_tensor *y, const sg_tensor *b)
{
    const int64_t n = y->numel, C = b->numel;
    int64_t blocks = (n + CONV_THREADS - 1) / CONV_THREADS;
    const int64_t cap = (int64_t)sg_ctx_sm_count(ctx) * CONV_BIAS_BLOCKS_PER_SM;
    if (blocks > cap) blocks = cap;
    bias_add_kernel<T><<<(int)blocks, CONV_THREADS, 0, (cudaStream_t)sg_ctx_stream(ctx)>>>(
        (T *)y->data, (const T *)b->data, n, C);
    SG_CUDA_CHECK_LAUNCH(ctx, "bias_add_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

template <typename T>
static sg_status bias_grad(sg_ctx *ctx, const conv_plan *pl, void *ws, const sg_tensor *dy, sg_tensor *db)
{
    const int64_t C = db->numel, M = dy->numel / C;
    float *partials = (float *)ws;
    cudaStream_t st = (cudaStream_t)sg_ctx_stream(ctx);
    dim3 grid((unsigned)((C + CONV_DB_COLS - 1) / CONV_DB_COLS), (unsigned)pl->db_parts);
    db_partial_kernel<T><<<grid, CONV_THREADS, 0, st>>>((const T *)dy->data, partials, M, C,
                                                        pl->db_rows);
    SG_CUDA_CHECK_LAUNCH(ctx, "db_partial_kernel");
    db_reduce_kernel<T><<<(unsigned)((C + CONV_THREADS - 1) / CONV_THREADS), CONV_THREADS, 0, st>>>(
        partials, pl->db_parts, C, (T *)db->data);
    SG_CUDA_CHECK_LAUNCH(ctx, "db_reduce_kernel");
    sg_ctx_count_launches(ctx, 2);
    return SG_OK;
}

/* ---- runs ---- */

/* The plan's handle, bound to the context's stream. */
static sg_status bind(sg_ctx *ctx, const conv_plan *pl)
{
    SG_CUDNN_CHECK(ctx, cudnnSetStream(pl->h, (cudaStream_t)sg_ctx_stream(ctx)));
    return SG_OK;
}

/* y = conv(x, w) (beta 0: written, not blended), then + b: two launches counted with b; ours
 * (c->own) add b before rounding, in one launch. */
extern "C" sg_status sg_conv2d_forward_cuda(sg_ctx *ctx, sg_conv2d *c, const sg_tensor *x,
                                            const sg_tensor *w, const sg_tensor *b, sg_tensor *y)
{
    const conv_plan *pl = (const conv_plan *)c->cuda;
    if (c->own & SG_CONV_OWN_FWD) {
        SG_TRY(sg_dwconv_forward_cuda(ctx, c, x->data, w->data, b ? b->data : NULL, y->data));
        sg_ctx_count_launches(ctx, 1);
        return SG_OK;
    }
    void *ws = NULL;
    SG_TRY(workspace(ctx, &ws));
    SG_TRY(bind(ctx, pl));
    SG_TRY(run_forward(ctx, c, pl, false, x->data, w->data, y->data, ws, c->ws_bytes));
    sg_ctx_count_launches(ctx, 1);
    if (!b) return SG_OK;
    return c->dtype == SG_DTYPE_BF16 ? bias_add<__nv_bfloat16>(ctx, y, b)
                                     : bias_add<float>(ctx, y, b);
}

/* dx (when asked for), dw, then db (when asked for): the passes run one after the other on
 * the stream, so they share the workspace. Launches: dx 1, dw 1 (ours 2), db 2. */
extern "C" sg_status sg_conv2d_backward_cuda(sg_ctx *ctx, sg_conv2d *c, const sg_tensor *x,
                                             const sg_tensor *w, const sg_tensor *dy,
                                             sg_tensor *dx, sg_tensor *dw, sg_tensor *db)
{
    const conv_plan *pl = (const conv_plan *)c->cuda;
    const bool own_data = c->own & SG_CONV_OWN_DATA, own_filter = c->own & SG_CONV_OWN_FILTER;
    void *ws = NULL;
    SG_TRY(workspace(ctx, &ws));
    if ((dx && !own_data) || !own_filter) SG_TRY(bind(ctx, pl));
    if (dx) {
        SG_TRY(run_data(ctx, c, pl, own_data, w->data, dy->data, dx->data, ws, c->ws_bytes));
        sg_ctx_count_launches(ctx, 1);
    }
    SG_TRY(run_filter(ctx, c, pl, own_filter, x->data, dy->data, dw->data, ws, c->ws_bytes));
    sg_ctx_count_launches(ctx, own_filter ? 2 : 1);
    if (!db) return SG_OK;
    return c->dtype == SG_DTYPE_BF16 ? bias_grad<__nv_bfloat16>(ctx, pl, ws, dy, db)
                                     : bias_grad<float>(ctx, pl, ws, dy, db);
}

#endif /* SG_HAVE_CUDNN */
