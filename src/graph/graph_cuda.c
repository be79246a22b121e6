/* graph_cuda.c: the capture engine's CUDA backend (the sg_graph_backend_i table, at the end):
 * thread-local stream capture, instantiate + upload, launch, cudaGraphExecUpdate with
 * re-instantiation as the fallback, and kernel-node argument updates. Compiled only when the
 * build has CUDA. */
#include "graph/graph.h"

#include <cuda_runtime.h>
#include <stdlib.h>

static cudaStream_t stream_of(sg_ctx *ctx) { return (cudaStream_t)sg_ctx_stream(ctx); }

static sg_status cuda_begin(sg_ctx *ctx)
{
    /* Thread-local: a CUDA call from this thread that is unsafe during capture fails, while
     * other threads' work is not disturbed. */
    SG_CUDA_CHECK(ctx, cudaStreamBeginCapture(stream_of(ctx), cudaStreamCaptureModeThreadLocal));
    return SG_OK;
}

static sg_status cuda_end(sg_ctx *ctx, void **graph)
{
    cudaGraph_t gr = NULL;
    cudaError_t e = cudaStreamEndCapture(stream_of(ctx), &gr);
    *graph = gr;
    if (e == cudaSuccess && gr) return SG_OK;
    cudaGetLastError(); /* the capture error is sticky on the thread, not the context */
    if (gr) cudaGraphDestroy(gr);
    *graph = NULL;
    return sg_fail(ctx, SG_ERR_CAPTURE,
                   "sg_graph_capture: CUDA invalidated the capture (%s: %s): work went to another "
                   "stream, or a CUDA call that may not run during capture was made (a sync, an "
                   "allocation, a legacy-stream launch)%s%s",
                   cudaGetErrorName(e), cudaGetErrorString(e), ctx->module ? " in module " : "",
                   ctx->module ? ctx->module : "");
}

static void cuda_discard(void *graph)
{
    if (graph) cudaGraphDestroy((cudaGraph_t)graph);
}

static int count_nodes(cudaGraph_t gr)
{
    size_t n = 0;
    if (cudaGraphGetNodes(gr, NULL, &n) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return (int)n;
}

static sg_status cuda_instantiate(sg_graph *g, void *graph)
{
    sg_ctx *ctx = g->ctx;
    cudaGraph_t gr = (cudaGraph_t)graph;
    cudaGraphExec_t exec = NULL;
    size_t free0 = 0, free1 = 0, total = 0;
    /* Every failure frees gr (and exec), as the table's contract says: nothing leaks. */
    const char *call = "cudaMemGetInfo";
    cudaError_t e = cudaMemGetInfo(&free0, &total);
    if (e == cudaSuccess) {
        call = "cudaGraphInstantiateWithFlags";
        e = cudaGraphInstantiateWithFlags(&exec, gr, 0);
    }
    if (e == cudaSuccess) {
        call = "cudaGraphUpload";
        e = cudaGraphUpload(exec, stream_of(ctx));
        if (e == cudaSuccess) e = cudaStreamSynchronize(stream_of(ctx));
    }
    if (e == cudaSuccess) {
        call = "cudaMemGetInfo";
        e = cudaMemGetInfo(&free1, &total);
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        if (exec) cudaGraphExecDestroy(exec);
        cudaGraphDestroy(gr);
        return sg_cuda_status(ctx, e, call, __FILE__, __LINE__);
    }
    g->st.exec_bytes = free0 > free1 ? free0 - free1 : 0;
    g->cuda_graph = gr;
    g->cuda_exec = exec;
    g->st.nodes = count_nodes(gr);
    return SG_OK;
}

static sg_status cuda_update(sg_graph *g, void *graph)
{
    cudaGraph_t gr = (cudaGraph_t)graph;
    cudaGraphExecUpdateResultInfo info;
    /* A different node count cannot be updated in place: skip straight to re-instantiation
     * (asking would only make CUDA report an error, which sanitizers then flag). */
    cudaError_t e = count_nodes(gr) == count_nodes((cudaGraph_t)g->cuda_graph)
                        ? cudaGraphExecUpdate((cudaGraphExec_t)g->cuda_exec, gr, &info)
                        : cudaErrorGraphExecUpdateFailure;
    if (e == cudaSuccess) {
        cudaGraphDestroy((cudaGraph_t)g->cuda_graph);
        g->cuda_graph = gr;
        g->st.nodes = count_nodes(gr);
        g->st.updates++;
        return SG_OK;
    }
    /* The topology changed (or a node cannot be updated): a new executable graph. */
    cudaGetLastError();
    cudaGraphExec_t old_exec = (cudaGraphExec_t)g->cuda_exec;
    cudaGraph_t old_graph = (cudaGraph_t)g->cuda_graph;
    SG_TRY(cuda_instantiate(g, gr));
    cudaGraphExecDestroy(old_exec);
    cudaGraphDestroy(old_graph);
    g->st.reinstantiations++;
    return SG_OK;
}

static sg_status cuda_launch(sg_graph *g)
{
    SG_CUDA_CHECK(g->ctx, cudaGraphLaunch((cudaGraphExec_t)g->cuda_exec, stream_of(g->ctx)));
    sg_ctx_count_launches(g->ctx, 1);
    return SG_OK;
}

static sg_status cuda_set_args(sg_graph *g, const void *func, int occurrence, void **args)
{
    sg_ctx *ctx = g->ctx;
    cudaGraph_t gr = (cudaGraph_t)g->cuda_graph;
    size_t n = 0;
    SG_CUDA_CHECK(ctx, cudaGraphGetNodes(gr, NULL, &n));
    cudaGraphNode_t *nodes = malloc((n ? n : 1) * sizeof *nodes);
    if (!nodes) return sg_fail(ctx, SG_ERR_OOM, "sg_graph_kernel_set_args: out of host memory");
    sg_status st = SG_OK;
    int seen = 0;
    bool done = false;
    if (cudaGraphGetNodes(gr, nodes, &n) != cudaSuccess) {
        st = sg_cuda_status(ctx, (int)cudaGetLastError(), "cudaGraphGetNodes", __FILE__, __LINE__);
        n = 0;
    }
    for (size_t i = 0; i < n && !done && st == SG_OK; i++) {
        enum cudaGraphNodeType type;
        if (cudaGraphNodeGetType(nodes[i], &type) != cudaSuccess || type != cudaGraphNodeTypeKernel) continue;
        struct cudaKernelNodeParams p;
        if (cudaGraphKernelNodeGetParams(nodes[i], &p) != cudaSuccess) {
            cudaGetLastError();
            continue;
        }
        if (p.func != func || seen++ != occurrence) continue;
        p.kernelParams = args;
        p.extra = NULL;
        cudaError_t e = cudaGraphExecKernelNodeSetParams((cudaGraphExec_t)g->cuda_exec, nodes[i], &p);
        if (e == cudaSuccess) e = cudaGraphKernelNodeSetParams(nodes[i], &p); /* keep the graph in step */
        if (e != cudaSuccess) st = sg_cuda_status(ctx, e, "cudaGraphExecKernelNodeSetParams", __FILE__, __LINE__);
        done = true;
    }
    free(nodes);
    if (st == SG_OK && !done)
        st = sg_fail(ctx, SG_ERR_INVALID,
                     "sg_graph_kernel_set_args: graph '%s' has %d launches of that kernel; occurrence %d "
                     "asked for", g->name, seen, occurrence);
    return st;
}

static void cuda_release(sg_graph *g)
{
    if (g->cuda_exec) cudaGraphExecDestroy((cudaGraphExec_t)g->cuda_exec);
    if (g->cuda_graph) cudaGraphDestroy((cudaGraph_t)g->cuda_graph);
    g->cuda_exec = g->cuda_graph = NULL;
}

const sg_graph_backend_i sg_graph_cuda = {
    .name = "CUDA",
    .begin = cuda_begin,
    .end = cuda_end,
    .discard = cuda_discard,
    .instantiate = cuda_instantiate,
    .update = cuda_update,
    .launch = cuda_launch,
    .set_args = cuda_set_args,
    .release = cuda_release,
};
