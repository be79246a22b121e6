/* graph.h: the capture engine's internals. graph.c holds what every backend shares (warm-up,
 * capture state, static inputs, statistics, the CPU plan); graph_cuda.c the CUDA Graph calls
 * behind the small table below. */
#ifndef SG_GRAPH_H
#define SG_GRAPH_H

#include "core/core.h"

#define SG_GRAPH_MAX_INPUTS 32

typedef struct sg_static_input {
    const sg_tensor *t;
    void *data;        /* where it pointed at capture */
    bool gone;         /* destroyed since */
    char name[64];
} sg_static_input;

struct sg_graph {
    sg_ctx *ctx;
    char name[64];
    sg_step_fn fn;
    void *user;
    sg_pool *pool;
    bool own_pool;
    bool eager;                  /* STEPGRAPH_DISABLE_GRAPHS: replay runs fn eagerly */
    sg_static_input in[SG_GRAPH_MAX_INPUTS];
    int n_in;
    sg_plan *plan;               /* CPU */
    void *cuda_graph, *cuda_exec;/* cudaGraph_t, cudaGraphExec_t */
    sg_block **deferred;         /* blocks freed during capture, released with the graph */
    sg_pool **deferred_pool;
    int n_deferred;
    sg_tensor **dead;            /* CPU: tensor structs the plan still names */
    int n_dead;
    sg_graph_stats st;
    struct sg_graph *next;       /* ctx->graphs */
};

#ifdef SG_HAVE_CUDA
sg_status sg_graph_cuda_begin(sg_ctx *ctx);
/* Ends capture (always, so the stream leaves capture mode); *graph is NULL on failure. */
sg_status sg_graph_cuda_end(sg_ctx *ctx, void **graph);
sg_status sg_graph_cuda_instantiate(sg_graph *g, void *graph);
sg_status sg_graph_cuda_update(sg_graph *g, void *graph);
sg_status sg_graph_cuda_launch(sg_graph *g);
sg_status sg_graph_cuda_set_args(sg_graph *g, const void *func, int occurrence, void **args);
void sg_graph_cuda_release(sg_graph *g);
void sg_graph_cuda_discard(void *graph);
#endif

#endif
