/* advise.h: the capture advisor. It tells, before capturing, what each scope (eager, layer,
 * model, step) will buy a model: a calibration of this device's launch path, a profile of the
 * model's eager steps, and a small explainable model that turns the two into a prediction per
 * scope (docs/advisor.md has the formulas). `stepgraph advise` prints them, then measures.
 *
 *     sg_advise_calib c;     sg_advise_calibrate(ctx, &c);                  // ~1 s, CUDA only
 *     sg_advise_profile p;   sg_advise_profile_model(ctx, "mlp-512-6-32", NULL, NULL, &p);
 *     sg_advise_prediction pr[SG_ADVISE_SCOPES];
 *     for (int s = 0; s < SG_ADVISE_SCOPES; s++) sg_advise_predict(&c, &p, (sg_scope)s, &pr[s]);
 *     sg_advise_summary sum; sg_advise_summarize(&c, &p, pr, &sum);      // checklist, verdict
 *
 * The prediction model (sg_advise_predict, sg_advise_summarize) is pure arithmetic on the two
 * structs, so tests drive it with inputs whose answers are known by hand. Calibration, profile
 * and measurement run on a CUDA context; the CPU backend has no launches to time, and they fail
 * there with SG_ERR_UNSUPPORTED. Times are microseconds unless a name says ms. (Design note:
 * the advisor runs models, so prof/ calls models/ here; docs/architecture.md.) */
#ifndef SG_PROF_ADVISE_H
#define SG_PROF_ADVISE_H

#include "stepgraph.h"

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* eager, layer, model, step: the sg_scope values, in order. */
#define SG_ADVISE_SCOPES 4
/* Checklist thresholds: the share of the eager step that launches cost (see summary). */
#define SG_ADVISE_SHARE_PAYS 0.15   /* above: launch-bound, graphs pay */
#define SG_ADVISE_SHARE_HELPS 0.05  /* above: partly launch-bound; at or below: GPU-bound */
#define SG_ADVISE_MAX_MODULES 64

/* ---- calibration: this device's launch path, measured through the library's own calls ---- */

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
    bool device_timed;           /* the device fields above are measured (CUPTI was there) */
    char note[256];              /* why they are not */
} sg_advise_calib;

/* Measures the calibration on ctx (a CUDA context; ~1 s): host time per eager launch, host
 * time of replaying graphs of 1, 16, 64 and 256 tiny kernels, device time per eager kernel, per
 * graph node and per graph launch, capture and instantiate time and executable-graph memory
 * per node. Leaves nothing allocated. SG_ERR_UNSUPPORTED on the CPU backend (no launches to
 * time: the advisor profiles a CUDA device) and with STEPGRAPH_DISABLE_GRAPHS=1. */
sg_status sg_advise_calibrate(sg_ctx *ctx, sg_advise_calib *out);

/* ---- profile: what eager steps of the real model show ---- */

/* Launches per step, and the host time queuing them, of one region of an eager step. */
typedef struct sg_advise_region {
    double launches;
    double host_us;
} sg_advise_region;

/* A child of the model's Sequential: the modules layer scope wraps, two graphs apiece. */
typedef struct sg_advise_module {
    char name[64];
    sg_advise_region forward, backward;
} sg_advise_module;

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
    int n_modules;
    /* The rest of the step (loss, optimizer) is step - load - forward - backward. */
    sg_advise_region load_static;/* the batch load once inputs are static (captured scopes copy
                                  * the batch in; eager steps of an mlp only rebind views) */
    double static_bytes;         /* device bytes the static inputs add (0: the model has them) */
    /* A trial capture of the step region (host syncs, data-dependent control flow). */
    bool capture_tried;
    bool step_captured;
    int step_nodes;              /* its nodes; 0 when unknown (then estimated from kernels) */
    char capture_error[512];     /* why the capture was refused */
    bool shapes_static;          /* no shape buckets: one graph serves every step */
    char note[256];              /* why CUPTI numbers are missing */
} sg_advise_profile;

/* Timing of profiles and measurements (as `stepgraph bench`). */
typedef struct sg_advise_timing {
    int warmup;                  /* untimed steps first (default 20; at least 5) */
    int steps;                   /* steps per timed block (default 50) */
    int repeats;                 /* blocks; the median is taken (default 5) */
    int busy_steps;              /* steps in the CUPTI window (default 20) */
} sg_advise_timing;

sg_advise_timing sg_advise_timing_default(void);

/* Builds model `name` (options mo, may be NULL) on ctx (CUDA), times eager steps, profiles
 * them with CUPTI, instruments one step by region, measures the static-input batch load and
 * tries to capture the step. A capture that is refused is reported in out, not as an error.
 * tm may be NULL (defaults). */
sg_status sg_advise_profile_model(sg_ctx *ctx, const char *name, const sg_model_options *mo,
                                  const sg_advise_timing *tm, sg_advise_profile *out);

/* ---- prediction ---- */

typedef struct sg_advise_prediction {
    sg_scope scope;
    double step_ms;              /* max(host_ms, device_ms); eager: the profiled wall time */
    double host_ms;              /* host time to queue a step under the scope */
    double device_ms;            /* GPU-busy + the device idle launches leave */
    bool host_bound;             /* host_ms >= device_ms */
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
    bool capturable;             /* false: the trial capture refused the step (step scope) */
    char note[256];              /* why SG_ERR_INVALID / SG_ERR_UNSUPPORTED was returned */
} sg_advise_prediction;

/* Predicts one scope from a calibration and a profile. SG_ERR_NULL, SG_ERR_INVALID (a scope
 * outside sg_scope, a negative or non-finite input: out->note says which), or
 * SG_ERR_UNSUPPORTED when the device side is unknown (no CUPTI: GPU-busy or gaps missing). */
sg_status sg_advise_predict(const sg_advise_calib *c, const sg_advise_profile *p, sg_scope scope,
                            sg_advise_prediction *out);

/* The checklist and the verdict, from the predictions of every scope (pred[s] for scope s). */
typedef struct sg_advise_summary {
    double gpu_utilisation;      /* GPU-busy / eager wall */
    double launch_share;         /* (eager wall - the step scope's device time) / eager wall:
                                  * the share of the eager step that launches cost */
    double short_kernel_share;   /* kernels under SG_PROF_SHORT_KERNEL_US */
    bool shapes_static;
    bool host_syncs;             /* the trial capture of the step was refused */
    sg_scope best;               /* fastest predicted scope that can be captured */
    double best_speedup;
    char verdict[320];           /* one line: "launch-bound: graphs pay (step scope ...)" */
} sg_advise_summary;

sg_status sg_advise_summarize(const sg_advise_calib *c, const sg_advise_profile *p,
                              const sg_advise_prediction pred[SG_ADVISE_SCOPES],
                              sg_advise_summary *out);

/* A break-even step count as printed: "never" (INFINITY), "-" (eager), else "%.0f". */
const char *sg_advise_steps_str(double steps, char *buf, size_t n);

/* ---- measurement: the scope itself, timed as the profile's eager steps ---- */

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
    bool fell_back;
    char fallback_reason[512];
} sg_advise_measurement;

/* Builds a fresh model `name` and trains it under `scope` on ctx: warm-up (capture included),
 * then timed blocks; GPU-busy by CUPTI when available. A failed capture is an error. */
sg_status sg_advise_measure(sg_ctx *ctx, const char *name, const sg_model_options *mo,
                            sg_scope scope, const sg_advise_timing *tm,
                            sg_advise_measurement *out);

#ifdef __cplusplus
}
#endif
#endif /* SG_PROF_ADVISE_H */
