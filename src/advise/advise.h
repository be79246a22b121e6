/* advise.h: the advisor's internals. sg_advise (advise.c, public in stepgraph.h) drives three
 * parts: the calibration of the device's launch path (calibrate.c), and the profile of a
 * model's eager steps and the measurement of each scope (profile.c), which build the model
 * through the caller's factory; the prediction arithmetic between them is prof/predict.c.
 * sg_advise_generate does the same for a generator's decode step (generate.c).
 * A layer above the models: it runs trainers on them, so it sits above src/models/. */
#ifndef SG_ADVISE_ADVISE_H
#define SG_ADVISE_ADVISE_H

#include "core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Timing of profiles and measurements (as `stepgraph bench`); sg_advise_options carries it. */
typedef struct sg_advise_timing {
    int warmup;                  /* untimed steps first (at least 5) */
    int steps;                   /* steps per timed block */
    int repeats;                 /* blocks; the median is taken */
    int busy_steps;              /* steps in the CUPTI window */
    int accum;                   /* micro-batches per optimizer step (1 to 1024): a "step" above
                                  * is an optimizer step of that many */
    /* The caller's other trainer options (NULL: defaults; sg_advise_options.trainer): the
     * runs' trainers start from them, scope, warmup and accum the advisor's. With steps_per_call
     * K every figure is still per optimizer step: the measured blocks, the warm-up and the
     * CUPTI window run whole calls (their step counts rounded up to multiples of K, the warm-up
     * at least the trainer's eager calls, the capture's and one replay's), the eager profile
     * one step a call, and the trial capture the step's plain graph (below). */
    const sg_trainer_options *trainer;
    sg_dtype optim_state;        /* the dtype of every optimizer's state (sg_optim_set_state_dtype,
                                  * sg_advise_options.optim_state): F32 or BF16 */
} sg_advise_timing;

/* SG_ERR_INVALID (message on ctx, naming fn) unless the timing is one the advisor can run:
 * the optimizer state F32 or BF16, and the trainer options: steps_per_call 0 to 1024, the
 * control-flow flags 0 or 1, an early-stop rule that can hold, vary_seq with seq_buckets (and
 * seq_buckets only with it, accum 1), no batch buckets and no data parallelism (the advisor
 * runs fixed batches in one process). */
sg_status sg_advise_check_timing(sg_ctx *ctx, const char *fn, const sg_advise_timing *tm);

/* Builds the model with factory (on ctx, CUDA), times eager steps, profiles them with CUPTI,
 * instruments one step by region, measures the static-input batch load and tries to capture
 * the step. A capture that is refused is reported in out, not as an error. The eager trainer
 * runs one step a call (the regions are one step's); the trial capture is of one plain step
 * (no loop, IF, SWITCH or early stop: step_nodes is the kernels one step replays, which the
 * prediction of steps_per_call steps a launch builds on). An early-stop rule that held during
 * the profile fails it: the later steps ran nothing. */
sg_status sg_advise_profile_model(sg_ctx *ctx, sg_model_factory factory, void *user,
                                  const sg_advise_timing *tm, sg_advise_profile *out);

/* Builds a fresh model with factory and trains it under `scope` on ctx: warm-up (capture
 * included), then timed blocks; GPU-busy by CUPTI when available. A failed capture is an
 * error. */
sg_status sg_advise_measure(sg_ctx *ctx, sg_model_factory factory, void *user, sg_scope scope,
                            const sg_advise_timing *tm, sg_advise_measurement *out);

/* sg_advise_generate once the thread is held (generate.c): r, g and out checked non-NULL, out
 * zeroed, o the caller's options or the defaults. */
sg_status sg_advise_gen_run(sg_ctx *ctx, sg_generator *g, const sg_generate_request *r, const sg_advise_options *o,
                            sg_advise_gen_result *out);

/* Shared by the parts: the monotonic clock in microseconds (the median is core's sg_median). */
double sg_advise_now_us(void);

#ifdef __cplusplus
}
#endif
#endif /* SG_ADVISE_ADVISE_H */
