/* model.h: the model object behind sg_model, whatever made it (a built-in kind or a user's
 * builder): the builder's modules and parameters, the root module, static input and target
 * tensors, the loss and its gradient, and the data set its batches come from. model.c makes it
 * (sg_builder_finish) and runs its passes; trainer.c trains it under a capture scope. */
#ifndef SG_TRAIN_MODEL_H
#define SG_TRAIN_MODEL_H

#include "nn/nn.h"
#include "nn/dataset.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sg_model_spec {
    int64_t batch, seq;        /* this shard's batch; positions a row (0: not a sequence model) */
} sg_model_spec;

struct sg_model {
    sg_ctx *ctx;
    char name[64];
    sg_model_spec spec;
    sg_builder *b;             /* the modules' shared state: parameters, generator, scratch */
    sg_param_set *params;      /* &b->params */
    sg_module *net;            /* the root: a Sequential (one is made around another root) */
    sg_loss_kind loss_kind;
    sg_dataset *data;          /* owned */
    sg_tensor *x;              /* the input the net reads: x_view (eager) or x_static */
    sg_tensor *targets;        /* what the loss reads: t_view or t_static (flattened to rows) */
    sg_tensor *x_view, *t_view;/* views into the data set, rebound per batch (eager) */
    sg_tensor *x_static, *t_static; /* own memory the batch is gathered into */
    sg_tensor *x_pad, *t_pad;  /* windows onto x_static / t_static past the real rows */
    sg_tensor *batch_idx;      /* (1) I32 on the device: the batch the gather loads next */
    sg_tensor *loss;           /* (1) F32 */
    sg_tensor *dlogits;        /* (rows, classes): written with the loss, in one pass */
    const sg_tensor *logits;   /* the net's output (owned by its last module) */
    int64_t classes;           /* the root's output features */
    /* token text (gpt): the data set's */
    struct sg_text *text;
    uint64_t data_seed;
    float dropout;
    int split;                 /* text split load_batch reads: 0 train, 1 validation */
    int64_t seq_len;           /* positions the passes run on (Tb <= T; sg_model_set_seq) */
    sg_tensor *rng;            /* the builder's dropout generator (NULL: none) */
    sg_tensor *gnorm, *nonfinite; /* clipping results, (1) F32 and (1) I32 */
    /* data parallelism */
    int shard, shards;         /* this model trains on rows shard*B/shards.. of each batch */
    int64_t global_batch;      /* the whole batch B; spec.batch is B / shards */
    int64_t *grad_ready;       /* (children of net): after child i's backward, gradients */
    int n_grad_ready;          /*   [grad_ready[i], total) of the flat buffer are final */
    /* mixed precision */
    sg_dtype precision;        /* SG_DTYPE_F32, or SG_DTYPE_BF16: activations and gradients */
    sg_tensor *scaler;         /* (SG_SCALER_COUNT) F32: sg_loss_scaler; every model has one */
    sg_tensor *found;          /* (1) I32: this step's gradients were not finite (skip it) */
    bool unscaled;             /* bf16 without loss scaling (SG_LOSS_SCALING_NONE): the scaler
                                * stays at scale 1, found at 0; nothing checks the gradients */
    bool building;             /* sg_builder_finish's probe: no fed batch is waited for */
    size_t bytes;              /* device bytes (whole blocks) allocated by the build and the
                                * static inputs: sg_trainer_stats splits them */
};

/* The optimizer's mixed precision over grad_lo and param_lo (sg_optim_set_mixed): with the
 * model's scaler and skip flag, or neither without loss scaling (m->unscaled). */
sg_status sg_model_set_mixed(sg_model *m, sg_optim *o, const sg_tensor *grad_lo, sg_tensor *param_lo);
/* Evaluation passes (no dropout) when on. */
static inline void sg_model_set_eval(sg_model *m, bool on) { m->b->eval = on; }
/* The loss of the last forward and its gradient, as the model's loss kind computes them; the
 * gradient times grad_scale (1, or 1/K for each of K accumulated micro-batches; the loss
 * itself is never scaled). */
sg_status sg_model_loss_pass(sg_model *m, float grad_scale);
/* From now on the net reads static input tensors and each batch is copied into them (as
 * captured graphs need fixed addresses). */
sg_status sg_model_use_static_inputs(sg_model *m);
/* Device-indexed loading (what a captured step uses): gather copies batch batch_idx into the
 * static inputs; advance adds one to batch_idx. Both are device work, capturable. */
sg_status sg_model_gather_batch(sg_model *m);
sg_status sg_model_advance_batch(sg_model *m);
sg_status sg_model_set_batch_index(sg_model *m, int64_t index);
/* Before the work of batch index is queued (fed data sets wait for its copy). */
sg_status sg_model_step_begin(sg_model *m, int64_t index);
/* Copies the first `rows` rows of batch `index` into the static inputs and pads them up to
 * `bucket` rows (inputs 0, targets -1, which the loss masks out); the net, the loss and its
 * gradient then run on `bucket` rows. */
sg_status sg_model_load_padded(sg_model *m, int64_t index, int64_t rows, int64_t bucket);
/* Sequence models: the passes run on sequences of Tb <= T positions: tokens (B, Tb), targets
 * and dlogits B*Tb rows, every module's buffers their first B*Tb rows. Host bookkeeping only:
 * no device work, no allocation. sg_model_load_batch puts the full T back. */
sg_status sg_model_set_seq(sg_model *m, int64_t Tb);
/* Text models: batch `index` as windows of len real tokens padded up to `bucket` positions
 * (tokens 0, targets -1, which the loss masks out); the passes then run at Tb = bucket. */
sg_status sg_model_load_seq(sg_model *m, int64_t index, int64_t len, int64_t bucket);
/* The full shape after padded steps (rows B, or T for sequence models): what a captured
 * full-size step expects. Host bookkeeping only. */
sg_status sg_model_full_shape(sg_model *m);
/* Every per-batch tensor at `rows` rows (1..the model's batch; models of samples): what
 * sg_model_load_padded sets for its bucket. Host bookkeeping. */
sg_status sg_model_set_rows(sg_model *m, int64_t rows);
/* Variable batch on the device: after a full-batch gather, pads the rows past those that
 * sg_vary_len(*step, the largest bucket) draws up to their bucket, as sg_model_load_padded
 * does, and writes the bucket's number into bucket_out (sg_dataset_pad_vary). */
sg_status sg_model_pad_vary(sg_model *m, const sg_tensor *step, const int64_t *buckets, int n_buckets,
                            sg_tensor *bucket_out);

/* Internal, for tests: the generator's logits of its last step (max_batch, V), the rows of the
 * call's batch bucket written. */
const sg_tensor *sg_generator_logits(const sg_generator *g);
/* The context g runs on. */
sg_ctx *sg_generator_ctx(const sg_generator *g);

/* Internal, for the advisor (src/advise/generate.c), which times a call's parts one by one:
 * queues one part of a call of r as sg_generate runs it, and neither syncs nor reads back.
 * PREFILL sets the generator up for r (sg_generate's checks, buckets and inputs) and runs the
 * prefill eagerly; EAGER queues one decode step of that request eagerly; GRAPH replays the
 * batch bucket's decode graph once (the first call captures it, its warm-up running the step:
 * make that call untimed) and sets *nodes (NULL: not) to the graph's nodes. r: PREFILL's only. */
typedef enum sg_gen_part { SG_GEN_PART_PREFILL = 0, SG_GEN_PART_EAGER, SG_GEN_PART_GRAPH } sg_gen_part;
sg_status sg_generator_part(sg_generator *g, const sg_generate_request *r, sg_gen_part part, int *nodes);

#ifdef __cplusplus
}
#endif
#endif
