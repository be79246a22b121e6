/* model.h: the model object behind sg_model: a parameter set, a network of nn modules, static
 * input and target tensors, the loss and its gradient, and a synthetic data set on the
 * device. Each model kind (mlp.c, gpt.c) fills one in from its canonical name. */
#ifndef SG_MODELS_MODEL_H
#define SG_MODELS_MODEL_H

#include "nn/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sg_model_spec {
    char kind[16];             /* "mlp" */
    int64_t width, depth, batch, seq;
} sg_model_spec;

struct sg_model {
    sg_ctx *ctx;
    char name[64];
    sg_model_spec spec;
    sg_param_set params;
    sg_module *net;
    sg_tensor *x;              /* (B, in) F32 input the net reads: x_view, or x_static */
    sg_tensor *targets;        /* (B) I32: t_view or t_static */
    sg_tensor *x_view, *t_view;/* views into data_x / data_y, rebound per batch */
    sg_tensor *x_static, *t_static; /* captured scopes: own memory, the batch is copied in */
    sg_tensor *x_pad, *t_pad;  /* windows onto x_static / t_static past the real rows */
    sg_tensor *batch_idx;      /* (1) I32 on the device: the batch the gather loads next */
    sg_tensor *loss;           /* (1) F32 */
    sg_tensor *dlogits;        /* (B, classes) F32: written with the loss, in one pass */
    const sg_tensor *logits;   /* the net's output (owned by its last module) */
    sg_tensor *data_x, *data_y;/* (nb, B, in) and (nb, B): the synthetic data set */
    int64_t n_batches, in_dim, classes;
    /* gpt */
    struct sg_text *text;      /* byte data set, train and validation */
    uint64_t data_seed;
    char data_path[512];
    float dropout;
    bool eval;                 /* forward for evaluation: no dropout */
    int split;                 /* text split load_batch reads: 0 train, 1 validation */
    int64_t seq_len;           /* positions the passes run on (Tb <= T; sg_model_set_seq) */
    sg_tensor *rng;            /* (4) I32: dropout seed and offset */
    sg_tensor *gnorm, *nonfinite; /* clipping results, (1) F32 and (1) I32 */
    /* data parallelism */
    int shard, shards;         /* this model trains on rows shard*B/shards.. of each batch */
    int64_t global_batch;      /* the name's batch B; spec.batch is B / shards */
    int64_t *grad_ready;       /* (children of net): after child i's backward, gradients */
    int n_grad_ready;          /*   [grad_ready[i], total) of the flat buffer are final */
    /* Buffers the modules share (gpt: the blocks' backward scratch and attention work), owned
     * by the model and destroyed with it, after the modules. */
    sg_tensor *shared[16];
    int n_shared;
    /* mixed precision */
    sg_dtype precision;        /* SG_DTYPE_F32, or SG_DTYPE_BF16: activations and gradients */
    sg_tensor *scaler;         /* (SG_SCALER_COUNT) F32: sg_loss_scaler; every model has one */
    sg_tensor *found;          /* (1) I32: this step's gradients were not finite (skip it) */
    size_t bytes;              /* device bytes (whole blocks) allocated by the build and the
                                * static inputs: sg_trainer_stats splits them */
};

/* "mlp-512-6-32" -> spec; SG_ERR_INVALID with a message listing the accepted forms. */
sg_status sg_model_parse(sg_ctx *ctx, const char *name, sg_model_spec *out);
sg_status sg_mlp_build(sg_model *m, uint64_t seed);
sg_status sg_gpt_build(sg_model *m, uint64_t seed);
/* What each kind's build allocates, counted from the same shapes (sg_model_estimate). */
void sg_mlp_estimate(const sg_model_spec *s, sg_model_size *out);
void sg_gpt_estimate(const sg_model_spec *s, sg_dtype precision, float dropout, sg_model_size *out);
/* From now on the net reads static input tensors and each batch is copied into them (as
 * captured graphs need fixed addresses). */
sg_status sg_model_use_static_inputs(sg_model *m);
/* Device-indexed loading (what a captured step uses): gather copies batch batch_idx into the
 * static inputs; advance adds one to batch_idx. Both are device work, capturable. */
sg_status sg_model_gather_batch(sg_model *m);
sg_status sg_model_advance_batch(sg_model *m);
sg_status sg_model_set_batch_index(sg_model *m, int64_t index);
#ifdef SG_HAVE_CUDA
sg_status sg_gather_batch_cuda(sg_model *m);
sg_status sg_advance_batch_cuda(sg_model *m);
#endif
/* Copies the first `rows` rows of batch `index` into the static inputs and pads them up to
 * `bucket` rows (inputs 0, targets -1, which the loss masks out); the net, the loss and its
 * gradient then run on `bucket` rows. */
sg_status sg_model_load_padded(sg_model *m, int64_t index, int64_t rows, int64_t bucket);
/* gpt: the passes run on sequences of Tb <= T positions: tokens (B, Tb), targets and dlogits
 * B*Tb rows, every module's (M, .) buffers and LayerNorm statistics their first B*Tb rows,
 * attention probabilities (B, H, Tb, Tb). Host bookkeeping only: no device work, no allocation.
 * sg_model_load_batch puts the full T back. */
sg_status sg_model_set_seq(sg_model *m, int64_t Tb);
/* gpt: batch `index` as windows of len real tokens (sg_text_batch_padded) padded up to
 * `bucket` positions (tokens 0, targets -1, which the loss masks out); the net, the loss and
 * its gradient then run at Tb = bucket. Attention is causal and the padding comes after the
 * real tokens, so the real positions compute what a length-len sequence computes. */
sg_status sg_model_load_seq(sg_model *m, int64_t index, int64_t len, int64_t bucket);
/* The full shape after padded steps (rows B for mlp models with static inputs, T for gpt):
 * what a captured full-size step expects. Host bookkeeping only. */
sg_status sg_model_full_shape(sg_model *m);
/* The children's grad_ready offsets: first_param[i] is the first parameter (in declaration
 * order) child i of net writes the gradient of; every later child's come after it, so after
 * child i's backward the gradients from that parameter's offset on are final. A child without
 * parameters gives -1 (the end of the buffer). */
sg_status sg_model_set_grad_ready(sg_model *m, const int *first_param, int n);
/* Fills data_x with N(0,1) inputs and data_y with the argmax of a fixed random linear
 * teacher over `classes` outputs: a learnable task, identical on every backend. */
sg_status sg_data_teacher(sg_model *m, uint64_t seed);

#ifdef __cplusplus
}
#endif
#endif
