/* mlp.c: mlp-WIDTH-DEPTH-BATCH. Input dim WIDTH; DEPTH hidden Linear(WIDTH, WIDTH) layers,
 * each with its ReLU fused into the matmul's epilogue; a Linear(WIDTH, 10) head; fused
 * softmax cross-entropy. Trained on a random linear teacher's labels (data.c). */
#include "models/model.h"

#define SG_MLP_CLASSES 10
#define SG_MLP_BATCHES 32   /* distinct batches in the synthetic data set */

/* Mirrors sg_mlp_build: weights and biases with their gradients; per hidden layer its output
 * and (but the first) its input gradient, the head's output and input gradient; the data set. */
void sg_mlp_estimate(const sg_model_spec *s, sg_model_size *out)
{
    double W = (double)s->width, L = (double)s->depth, B = (double)s->batch, K = SG_MLP_CLASSES;
    double P = L * (W * W + W) + K * W + K;
    out->params = (int64_t)P;
    out->param_bytes = (size_t)(2 * P * 4);
    out->optim_bytes = (size_t)(2 * P * 4);
    out->activation_bytes = (size_t)(((2 * L) * B * W + 2 * B * K) * 4);
    out->data_bytes = (size_t)(SG_MLP_BATCHES * B * (W + 1) * 4);
}

sg_status sg_mlp_build(sg_model *m, uint64_t seed)
{
    sg_ctx *ctx = m->ctx;
    int64_t W = m->spec.width, L = m->spec.depth, B = m->spec.batch;
    m->in_dim = W;
    m->classes = SG_MLP_CLASSES;
    m->n_batches = SG_MLP_BATCHES;

    /* Parameters: per layer w (out, in) with decay, b (out) without. */
    int nl = (int)L + 1;
    int wi[66], bi[66];
    for (int l = 0; l < nl; l++) {
        int64_t out = l == L ? SG_MLP_CLASSES : W, in = W;
        char n[64];
        snprintf(n, sizeof n, "layers.%d.weight", l);
        wi[l] = sg_params_declare(&m->params, n, 2, (int64_t[]){out, in}, 1, SG_INIT_UNIFORM_FAN_IN, in);
        snprintf(n, sizeof n, "layers.%d.bias", l);
        bi[l] = sg_params_declare(&m->params, n, 1, &out, 0, SG_INIT_UNIFORM_FAN_IN, in);
        if (wi[l] < 0 || bi[l] < 0) return SG_ERR_INVALID;
    }
    SG_TRY(sg_params_allocate(&m->params, seed));

    sg_module *layers[66];
    for (int l = 0; l < nl; l++) {
        char n[64];
        snprintf(n, sizeof n, "layers.%d", l);
        sg_param_set *p = &m->params;
        sg_status st = sg_linear_create(ctx, n, B, p->param[wi[l]], p->param[bi[l]], p->grad[wi[l]],
                                        p->grad[bi[l]], l == L ? SG_ACT_NONE : SG_ACT_RELU, l > 0,
                                        &layers[l]);
        if (st != SG_OK) {
            while (l--) sg_module_destroy(layers[l]);
            return st;
        }
    }
    SG_TRY(sg_sequential_create(ctx, "mlp", layers, nl, &m->net));
    SG_TRY(sg_model_set_grad_ready(m, wi, nl)); /* layer l writes its weight, then its bias */

    SG_TRY(sg_tensor_create(ctx, SG_DTYPE_F32, 3, (int64_t[]){m->n_batches, B, W}, "data.x", &m->data_x));
    SG_TRY(sg_tensor_create(ctx, SG_DTYPE_I32, 2, (int64_t[]){m->n_batches, B}, "data.y", &m->data_y));
    SG_TRY(sg_tensor_view(m->data_x, 0, 2, (int64_t[]){B, W}, "input", &m->x_view));
    SG_TRY(sg_tensor_view(m->data_y, 0, 1, &B, "targets", &m->t_view));
    m->x = m->x_view, m->targets = m->t_view;
    SG_TRY(sg_tensor_create(ctx, SG_DTYPE_F32, 1, (int64_t[]){1}, "loss", &m->loss));
    SG_TRY(sg_tensor_create(ctx, SG_DTYPE_F32, 2, (int64_t[]){B, SG_MLP_CLASSES}, "dlogits", &m->dlogits));
    return sg_data_teacher(m, seed ^ 0x5eedda7aull);
}
