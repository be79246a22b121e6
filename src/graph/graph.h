/* graph.h: the capture engine's internals. graph.c holds what every backend shares (warm-up,
 * capture state, static inputs, statistics, the list of live graphs); the backends fill the
 * table sg_graph_backend_i below: graph_cpu.c with CPU plans, graph_cuda.c with CUDA Graphs. */
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
    const struct sg_graph_backend_i *be; /* the context's backend's table */
    sg_plan *plan;               /* CPU */
    void *cuda_graph, *cuda_exec;/* cudaGraph_t, cudaGraphExec_t */
    sg_block **deferred;         /* blocks freed during capture, released with the graph */
    sg_pool **deferred_pool;
    int n_deferred;
    sg_tensor **dead;            /* CPU: tensor structs the plan still names */
    int n_dead;
    sg_graph_stats st;
    struct sg_graph *next;       /* the context's live graphs (sg_graphs_of) */
};

/* The context's live graphs, newest first (NULL: none). */
sg_graph *sg_graphs_of(const sg_ctx *ctx);

/* ---- backends: one table each (CPU plans, CUDA Graphs), filled slot by slot ----
 * A recording ("rec") is what one capture of the step produced: an sg_plan * on the CPU, a
 * cudaGraph_t on CUDA. graph.c sets up the capture state (pool, ctx->cap) around begin/end and
 * keeps every statistic that is not the backend's own (nodes, exec_bytes, updates). */
typedef struct sg_graph_backend_i {
    const char *name;                                   /* "CPU", "CUDA": for messages */
    /* Starts recording the context's work (CPU: a new plan that sg_cpu_run appends to;
     * CUDA: stream capture). On failure nothing is left to undo. */
    sg_status (*begin)(sg_ctx *ctx);
    /* Stops recording, always (so the stream leaves capture mode), even after the step
     * failed; *rec: the recording, NULL when there is none. */
    sg_status (*end)(sg_ctx *ctx, void **rec);
    /* Frees a recording that will not be kept (a failed capture). */
    void (*discard)(void *rec);
    /* Makes rec g's executable form (first capture); sets g->st.nodes and exec_bytes. On
     * failure rec is freed. */
    sg_status (*instantiate)(sg_graph *g, void *rec);
    /* Replaces g's executable form with rec (recapture), in place where the backend can;
     * counts g->st.updates or reinstantiations. */
    sg_status (*update)(sg_graph *g, void *rec);
    /* Queues one replay on the context's stream. */
    sg_status (*launch)(sg_graph *g);
    /* Optional: rewrites a kernel node's arguments (sg_graph_kernel_set_args). NULL: the
     * backend has no kernel nodes (CPU). */
    sg_status (*set_args)(sg_graph *g, const void *func, int occurrence, void **args);
    /* Frees g's recording and executable form (safe when capture never finished). */
    void (*release)(sg_graph *g);
    /* Records a conditional region during capture (cond.c checked the arguments): fns[0..n)
     * are the bodies (IF and WHILE: one), v the int32 device value that picks. CPU: a plan
     * entry holding a sub-plan per body; CUDA: a conditional node whose bodies are captured
     * from fns. With ctx->cap.cond_depth raised while a body records. */
    sg_status (*cond)(sg_ctx *ctx, sg_cond_kind kind, const sg_tensor *v, int n, const sg_step_fn *fns,
                      void *const *users);
    /* The kinds cond can record here: bit (1 << kind). */
    int (*cond_kinds)(const sg_ctx *ctx);
} sg_graph_backend_i;

/* The table of ctx's backend. */
const sg_graph_backend_i *sg_graph_backend_of(const sg_ctx *ctx);
/* Runs (or records) one body: ctx->cond_depth raised and ctx->cond_kind set around fn. */
sg_status sg_cond_body(sg_ctx *ctx, sg_cond_kind kind, sg_step_fn fn, void *user);

extern const sg_graph_backend_i sg_graph_cpu;   /* graph_cpu.c */
#ifdef SG_HAVE_CUDA
extern const sg_graph_backend_i sg_graph_cuda;  /* graph_cuda.c: CUDA builds only */
#endif

#endif
