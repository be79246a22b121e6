/* model.c: the model object, whatever made it: sg_builder_finish lays out the parameters the
 * modules declared and binds them, makes the inputs, targets, loss and data set the model
 * trains on; then the public sg_model_* passes (forward with the loss, backward), batch
 * loading (eager views, or the device gather a captured step runs) and sg_optim_create. */
#include "train/model.h"
#include "nn/text.h"

#include <stdlib.h>

/* ---- making the model ---- */

void sg_model_destroy(sg_model *m)
{
    if (!m) return;
    sg_module_free(m->net);
    if (m->data) {
        m->data->owned = false;
        sg_dataset_destroy(m->data);
    }
    sg_tensor *ts[] = {m->scaler, m->found, m->gnorm, m->nonfinite, m->batch_idx, m->x_pad, m->t_pad,
                       m->x_view, m->t_view, m->x_static, m->t_static, m->loss, m->dlogits};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) sg_tensor_destroy(ts[i]);
    sg_builder_release(m->b); /* after the modules: shared scratch, generator, parameters */
    free(m->grad_ready);
    free(m);
}

/* The loss scaler (sg_loss_scaler on the device) and the skip flag; fp32 models keep one too,
 * so that checkpoints of either precision hold the same tensors. Without loss scaling the
 * scale is 1 and stays so (nothing updates the scaler). */
static sg_status create_scaler(sg_model *m)
{
    sg_loss_scaler s = {m->unscaled ? 1.f : 65536.f, 0.f, 2000.f, 0.f};
    SG_TRY(sg_tensor_create(m->ctx, SG_DTYPE_F32, 1, (int64_t[]){SG_SCALER_COUNT}, "amp.scaler", &m->scaler));
    SG_TRY(sg_tensor_copy_from_host(m->scaler, &s, sizeof s));
    SG_TRY(sg_tensor_create(m->ctx, SG_DTYPE_I32, 1, (int64_t[]){1}, "amp.found", &m->found));
    return sg_tensor_fill(m->found, 0.0);
}

/* After child i of the root's backward, the gradients from its first parameter's offset on
 * are final (children declare their parameters in order; one without gives the end). */
static sg_status set_grad_ready(sg_model *m)
{
    int n = sg_sequential_count(m->net);
    m->grad_ready = malloc((size_t)(n > 0 ? n : 1) * sizeof *m->grad_ready);
    if (!m->grad_ready) return sg_fail(m->ctx, SG_ERR_OOM, "sg_builder_finish: out of host memory");
    int64_t next = m->params->total;
    for (int i = n - 1; i >= 0; i--) { /* a child without parameters: final from the next one's */
        int p = sg_sequential_child(m->net, i)->first_param;
        m->grad_ready[i] = p >= 0 ? m->params->info[p].offset : next;
        next = m->grad_ready[i];
    }
    m->n_grad_ready = n;
    return SG_OK;
}

/* Inputs and targets: a batch of the data set's samples (x (B, sample...), y (B, sample...))
 * in static tensors; eager steps read views into the data set instead when a batch's rows are
 * back to back. The loss sees the targets as (rows) for cross-entropy, (rows, d) for MSE. */
static sg_status make_inputs(sg_model *m)
{
    sg_ctx *ctx = m->ctx;
    sg_dataset *d = m->data;
    int64_t B = m->spec.batch, rows = m->b->rows;
    if (d->kind == SG_DATASET_TEXT) {
        int64_t T = m->spec.seq;
        SG_TRY(sg_tensor_create(ctx, SG_DTYPE_I32, 2, (int64_t[]){B, T}, "tokens", &m->x_static));
        SG_TRY(sg_tensor_create(ctx, SG_DTYPE_I32, 1, &rows, "targets", &m->t_static));
        SG_TRY(sg_tensor_view(m->t_static, 0, 2, (int64_t[]){B, T}, "targets.bt", &m->t_view));
        SG_TRY(sg_tensor_create(ctx, SG_DTYPE_I32, 1, (int64_t[]){1}, "batch.index", &m->batch_idx));
        m->x = m->x_static, m->targets = m->t_static;
        return SG_OK;
    }
    /* Samples: x (B, ...) in the data set's sample shape; the targets as the loss reads them:
     * (rows) class indices, or (rows, d) values. */
    int64_t xs[SG_MAX_DIMS];
    xs[0] = B;
    for (int i = 1; i < d->x->ndim; i++) xs[i] = d->x->shape[i];
    int64_t per = d->y_row * B; /* target elements a batch */
    bool xent = m->loss_kind == SG_LOSS_SOFTMAX_XENT;
    if (xent ? per != rows : per % rows)
        return sg_fail(ctx, SG_ERR_SHAPE, "sg_builder_finish: '%s': a sample's target has %lld elements, %lld a "
                       "batch of %lld; the %s loss over the root's %lld rows needs %s", m->name, (long long)d->y_row,
                       (long long)per, (long long)B, xent ? "cross-entropy" : "MSE", (long long)rows,
                       xent ? "one class index a row" : "a whole number of values a row");
    if (xent && d->y->dtype != SG_DTYPE_I32)
        return sg_fail(ctx, SG_ERR_DTYPE, "sg_builder_finish: '%s': cross-entropy targets are i32 class indices; "
                       "the data set's are %s", m->name, sg_dtype_name(d->y->dtype));
    if (!xent && d->y->dtype != SG_DTYPE_F32)
        return sg_fail(ctx, SG_ERR_DTYPE, "sg_builder_finish: '%s': MSE targets are f32; the data set's are %s",
                       m->name, sg_dtype_name(d->y->dtype));
    SG_TRY(sg_tensor_view(d->x, 0, d->x->ndim, xs, "input", &m->x_view));
    if (xent) SG_TRY(sg_tensor_view(d->y, 0, 1, &rows, "targets", &m->t_view));
    else SG_TRY(sg_tensor_view(d->y, 0, 2, (int64_t[]){rows, per / rows}, "targets", &m->t_view));
    m->x = m->x_view, m->targets = m->t_view;
    return SG_OK;
}

/* The loss and its gradient, (rows, classes): f32 for MSE, else the precision. */
static sg_status make_loss(sg_model *m, int64_t classes)
{
    sg_ctx *ctx = m->ctx;
    int64_t rows = m->b->rows;
    m->classes = classes;
    SG_TRY(sg_tensor_create(ctx, SG_DTYPE_F32, 1, (int64_t[]){1}, "loss", &m->loss));
    sg_dtype dt = m->loss_kind == SG_LOSS_MSE ? SG_DTYPE_F32 : m->precision;
    return sg_tensor_create(ctx, dt, 2, (int64_t[]){rows, classes}, "dlogits", &m->dlogits);
}

/* The root's output width, the one fact of shape the builder does not hold: one eager
 * forward on the first batch gives it (and checks every module's shapes before training). */
static sg_status probe_classes(sg_model *m, int64_t *classes)
{
    const sg_tensor *y = NULL;
    m->b->eval = true; /* no dropout: nothing of the generator's state is touched */
    sg_status st = sg_module_forward(m->net, m->x, &y);
    m->b->eval = false;
    SG_TRY(st);
    if (!y || y->ndim != 2 || y->shape[0] != m->b->rows)
        return sg_fail(m->ctx, SG_ERR_SHAPE, "sg_builder_finish: '%s': the root's output must be (rows, features) "
                       "with rows %lld", m->name, (long long)m->b->rows);
    *classes = y->shape[1];
    if (m->loss_kind == SG_LOSS_MSE && m->targets->shape[1] != *classes)
        return sg_fail(m->ctx, SG_ERR_SHAPE, "sg_builder_finish: '%s': the root gives %lld values a row, the "
                       "targets %lld", m->name, (long long)*classes, (long long)m->targets->shape[1]);
    return SG_OK;
}

static sg_status finish(sg_builder *b, sg_model *m, sg_module *root, uint64_t seed)
{
    /* The root is a Sequential (layer scope captures its children one by one). */
    if (sg_sequential_count(root) == 0) {
        sg_module *seq = NULL;
        SG_TRY(sg_module_sequential(b, b->name, &root, 1, &seq));
        root = seq;
    }
    root->owned = true;
    m->net = root;
    root->no_input_grad = true;
    SG_TRY(sg_params_allocate(&b->params, seed));
    if (b->opts.precision == SG_DTYPE_BF16) SG_TRY(sg_params_allocate_lowp(&b->params));
    if (b->bufs.count) SG_TRY(sg_params_allocate(&b->bufs, seed)); /* zeros and ones: no draws */
    b->finished = true;
    SG_TRY(sg_module_finish(root));
    SG_TRY(sg_builder_bind_recompute(b)); /* the regions' buffers into their arena, before any pass */
    if (b->rng) { /* dropout: seed and offset on the device; each shard draws its own masks */
        uint64_t ds = seed + (uint64_t)m->shard * 0x9e3779b97f4a7c15ull;
        int32_t rs[4] = {(int32_t)(ds & 0x7fffffff), (int32_t)(ds >> 32), 0, 0};
        SG_TRY(sg_tensor_copy_from_host(b->rng, rs, sizeof rs));
        m->rng = b->rng;
    }
    SG_TRY(set_grad_ready(m));
    if (m->data->kind == SG_DATASET_TEXT) {
        m->text = m->data->text;
        m->data_seed = seed ^ 0xda7a5eedull;
        sg_text_set_row0(m->text, (int64_t)m->shard * m->spec.batch); /* this shard's rows */
    }
    return SG_OK;
}

sg_status sg_builder_finish(sg_builder *b, sg_module *root, sg_loss_kind loss, sg_dataset *data,
                            uint64_t seed, sg_model **out)
{
    if (!b) {
        sg_dataset_destroy(data);
        return SG_ERR_NULL;
    }
    sg_ctx *ctx = b->ctx;
    sg_status st = SG_OK;
    if (!out) st = sg_fail(ctx, SG_ERR_NULL, "sg_builder_finish: out is NULL");
    else *out = NULL;
    if (st == SG_OK && (!root || !data))
        st = sg_fail(ctx, SG_ERR_NULL, "sg_builder_finish: '%s': root or data is NULL", b->name);
    if (st == SG_OK && (root->b != b || root->owned))
        st = sg_fail(ctx, SG_ERR_INVALID, "sg_builder_finish: '%s': root '%s' %s", b->name, sg_module_label(root),
                     root->b != b ? "was made by another builder" : "belongs to a container");
    if (st == SG_OK && (data->ctx != ctx || data->owned))
        st = sg_fail(ctx, SG_ERR_INVALID, "sg_builder_finish: '%s': the data set %s", b->name,
                     data->ctx != ctx ? "belongs to another context" : "belongs to another model");
    if (st == SG_OK && loss != SG_LOSS_SOFTMAX_XENT && loss != SG_LOSS_MSE)
        st = sg_fail(ctx, SG_ERR_INVALID, "sg_builder_finish: '%s': unknown loss %d", b->name, (int)loss);
    if (st == SG_OK && loss == SG_LOSS_MSE && b->opts.precision != SG_DTYPE_F32)
        st = sg_fail(ctx, SG_ERR_UNSUPPORTED, "sg_builder_finish: '%s': the MSE loss is implemented for f32 "
                     "models", b->name);
    if (st == SG_OK && data->kind == SG_DATASET_TEXT && b->opts.seq < 1)
        st = sg_fail(ctx, SG_ERR_INVALID, "sg_builder_finish: '%s': a text data set needs a sequence model "
                     "(builder seq > 0)", b->name);
    if (st == SG_OK && data->kind == SG_DATASET_FED && data->batch != b->batch)
        st = sg_fail(ctx, SG_ERR_SHAPE, "sg_builder_finish: '%s': the fed data set's batch is %lld, the model's "
                     "%lld", b->name, (long long)data->batch, (long long)b->batch);
    sg_model *m = st == SG_OK ? calloc(1, sizeof *m) : NULL;
    if (st == SG_OK && !m) st = sg_fail(ctx, SG_ERR_OOM, "sg_builder_finish: out of host memory");
    if (st != SG_OK) {
        if (data && !data->owned) sg_dataset_destroy(data);
        sg_builder_destroy(b);
        return st;
    }
    sg_alloc_stats a1;
    size_t bytes0 = b->bytes0;
    m->ctx = ctx;
    m->b = b;
    m->params = &b->params;
    snprintf(m->name, sizeof m->name, "%s", b->name);
    m->spec.batch = b->batch, m->spec.seq = b->opts.seq;
    m->seq_len = b->opts.seq;
    m->global_batch = b->opts.batch;
    m->shard = b->opts.shard, m->shards = b->opts.shards;
    m->precision = b->opts.precision;
    m->unscaled = m->precision == SG_DTYPE_BF16 && b->opts.loss_scaling == SG_LOSS_SCALING_NONE;
    m->dropout = b->opts.dropout;
    m->loss_kind = loss;
    m->data = data;
    data->owned = true;
    m->building = true;
    st = create_scaler(m);
    if (st == SG_OK) st = finish(b, m, root, seed);
    else sg_builder_destroy(b), m->b = NULL; /* the modules were not handed over yet */
    if (st == SG_OK) st = make_inputs(m);
    int64_t classes = 0;
    if (st == SG_OK) st = sg_model_load_batch(m, 0);
    if (st == SG_OK) st = probe_classes(m, &classes);
    if (st == SG_OK) st = make_loss(m, classes);
    if (st == SG_OK) st = sg_tensor_create(ctx, SG_DTYPE_F32, 1, (int64_t[]){1}, "grad.norm", &m->gnorm);
    if (st == SG_OK) st = sg_tensor_create(ctx, SG_DTYPE_I32, 1, (int64_t[]){1}, "grad.nonfinite", &m->nonfinite);
    if (st == SG_OK) st = sg_ctx_sync(ctx);
    sg_ctx_alloc_stats(ctx, &a1);
    m->bytes = a1.bytes_in_use - bytes0; /* one stream, one thread: all of it is ours */
    m->logits = NULL; /* the probe's forward is not a step's */
    m->building = false;
    if (st != SG_OK) {
        if (!m->net && m->b) sg_builder_destroy(m->b), m->b = NULL; /* the root was not adopted */
        sg_model_destroy(m);
        return st;
    }
    *out = m;
    return SG_OK;
}

/* ---- the public accessors ---- */

const char *sg_model_name(const sg_model *m) { return m ? m->name : ""; }
sg_dtype sg_model_precision(const sg_model *m) { return m ? m->precision : SG_DTYPE_F32; }
int64_t sg_model_param_count(const sg_model *m)
{
    int64_t n = 0;
    for (int i = 0; m && i < m->params->count; i++) n += m->params->info[i].numel;
    return n;
}
sg_tensor *sg_model_params(sg_model *m) { return m ? m->params->flat : NULL; }
int sg_model_param_tensors(const sg_model *m) { return m ? m->params->count : 0; }
sg_status sg_model_param_info(const sg_model *m, int i, const char **name, int64_t *offset, int64_t *numel)
{
    if (!m) return SG_ERR_NULL;
    if (i < 0 || i >= m->params->count)
        return sg_fail(m->ctx, SG_ERR_INVALID, "sg_model_param_info: index %d: '%s' has %d parameter tensors", i,
                       m->name, m->params->count);
    if (name) *name = m->params->info[i].name;
    if (offset) *offset = m->params->info[i].offset;
    if (numel) *numel = m->params->info[i].numel;
    return SG_OK;
}
sg_tensor *sg_model_grads(sg_model *m) { return m ? m->params->grad_flat : NULL; }
sg_tensor *sg_model_grads_lo(sg_model *m) { return m ? m->params->grad_flat_lo : NULL; }

sg_tensor *sg_model_buffers(sg_model *m) { return m && m->b && m->b->bufs.count ? m->b->bufs.flat : NULL; }
int sg_model_buffer_tensors(const sg_model *m) { return m && m->b ? m->b->bufs.count : 0; }

sg_status sg_model_buffer_info(const sg_model *m, int i, const char **name, int64_t *offset, int64_t *numel)
{
    if (!m) return SG_ERR_NULL;
    const sg_param_set *bs = &m->b->bufs;
    if (i < 0 || i >= bs->count)
        return sg_fail(m->ctx, SG_ERR_INVALID, "sg_model_buffer_info: '%s': buffer %d of %d", m->name, i, bs->count);
    if (name) *name = bs->info[i].name;
    if (offset) *offset = bs->info[i].offset;
    if (numel) *numel = bs->info[i].numel;
    return SG_OK;
}
const sg_tensor *sg_model_loss(const sg_model *m) { return m ? m->loss : NULL; }
const sg_tensor *sg_model_loss_scaler(const sg_model *m) { return m ? m->scaler : NULL; }

sg_status sg_model_set_mixed(sg_model *m, sg_optim *o, const sg_tensor *grad_lo, sg_tensor *param_lo)
{
    return sg_optim_set_mixed(o, grad_lo, m->unscaled ? NULL : m->scaler, m->unscaled ? NULL : m->found, param_lo);
}
const sg_tensor *sg_model_logits(const sg_model *m) { return m ? m->logits : NULL; }
sg_tensor *sg_model_input(sg_model *m) { return m ? m->x : NULL; }

/* ---- batches ---- */

static sg_status set_rows(sg_model *m, int64_t rows);

/* The samples a pass reads: the validation split's while evaluating split 1. */
static sg_dataset *split_data(const sg_model *m) { return m->split == 1 && m->data->val ? m->data->val : m->data; }

int64_t sg_model_split_size(const sg_model *m, int split)
{
    if (!m || (split != 0 && split != 1)) return 0;
    if (m->text) return sg_text_size(m->text, split);
    return split == 0 ? m->data->n : m->data->val ? m->data->val->n : 0;
}

/* Eager steps point the input views at the batch when its rows lie back to back: no copy, no
 * launch. Otherwise (rows that wrap, captured steps that need fixed addresses) the batch is
 * gathered into the static inputs on the device. */
sg_status sg_model_load_batch(sg_model *m, int64_t index)
{
    if (!m) return SG_ERR_NULL;
    if (index < 0)
        return sg_fail(m->ctx, SG_ERR_INVALID, "sg_model_load_batch: batch index %lld < 0", (long long)index);
    if (m->text) {
        SG_TRY(sg_model_full_shape(m)); /* a padded step may have left a shorter length */
        return sg_text_batch_host(m->text, m->split, m->data_seed, index, m->x_static, m->t_view);
    }
    if (!m->building) SG_TRY(sg_model_step_begin(m, index));
    sg_dataset *d = split_data(m);
    int64_t B = m->spec.batch, stride = d->kind == SG_DATASET_FED ? B : m->global_batch;
    int64_t offset = d->kind == SG_DATASET_FED ? 0 : (int64_t)m->shard * B;
    if (!m->x_static) {
        int64_t s0 = sg_dataset_contiguous(d, index, stride, offset, B);
        if (s0 >= 0) {
            m->x_view->data = (char *)d->x->data + (size_t)(s0 * d->x_row) * 4;
            m->t_view->data = (char *)d->y->data + (size_t)(s0 * d->y_row) * 4;
            return SG_OK;
        }
        SG_TRY(sg_model_use_static_inputs(m)); /* rows that wrap: gather them */
    }
    SG_TRY(sg_model_full_shape(m)); /* a padded step may have left fewer rows */
    SG_TRY(sg_model_set_batch_index(m, index));
    return sg_model_gather_batch(m);
}

sg_status sg_model_step_begin(sg_model *m, int64_t index)
{
    return m->data ? sg_dataset_step_begin(m->data, index) : SG_OK;
}

sg_status sg_model_set_batch_index(sg_model *m, int64_t index)
{
    const sg_dataset *d = split_data(m);
    int32_t i = (int32_t)(m->text ? index : index % (d->n > 0 ? d->n : 1));
    return sg_tensor_write_small(m->batch_idx, 0, &i, sizeof i);
}

sg_status sg_model_gather_batch(sg_model *m)
{
    if (m->text) return sg_text_batch_device(m->text, 0, m->data_seed, m->batch_idx, m->x_static, m->t_view);
    sg_dataset *d = split_data(m);
    int64_t B = m->spec.batch;
    bool fed = d->kind == SG_DATASET_FED;
    return sg_dataset_gather(d, m->batch_idx, fed ? B : m->global_batch, fed ? 0 : (int64_t)m->shard * B,
                             m->x_static, m->t_static);
}

typedef struct advance_args {
    int32_t *idx;
} advance_args;

static sg_status advance_cpu(sg_ctx *ctx, const void *p)
{
    (void)ctx;
    *((const advance_args *)p)->idx += 1;
    return SG_OK;
}

sg_status sg_model_advance_batch(sg_model *m)
{
    if (m->ctx->backend == SG_BACKEND_CPU)
        return sg_cpu_run(m->ctx, advance_cpu, &(advance_args){m->batch_idx->data}, sizeof(advance_args));
    return SG_CUDA_DISPATCH(m->ctx, sg_index_advance_cuda(m->ctx, m->batch_idx));
}

sg_status sg_model_use_static_inputs(sg_model *m)
{
    if (m->x_static) return SG_OK; /* (text models are built with them) */
    sg_alloc_stats a0, a1;
    sg_ctx_alloc_stats(m->ctx, &a0);
    SG_TRY(sg_tensor_create(m->ctx, m->x_view->dtype, m->x_view->ndim, m->x_view->shape, "input.static",
                            &m->x_static));
    SG_TRY(sg_tensor_create(m->ctx, m->t_view->dtype, m->t_view->ndim, m->t_view->shape, "targets.static",
                            &m->t_static));
    SG_TRY(sg_tensor_create(m->ctx, SG_DTYPE_I32, 1, (int64_t[]){1}, "batch.index", &m->batch_idx));
    sg_ctx_alloc_stats(m->ctx, &a1);
    m->bytes += a1.bytes_in_use - a0.bytes_in_use;
    SG_TRY(sg_tensor_view(m->x_static, 0, m->x_static->ndim, m->x_static->shape, "input.pad", &m->x_pad));
    SG_TRY(sg_tensor_view(m->t_static, 0, m->t_static->ndim, m->t_static->shape, "targets.pad", &m->t_pad));
    m->x = m->x_static, m->targets = m->t_static;
    return SG_OK;
}

/* Rows of every per-batch tensor the step touches. */
static sg_status set_rows(sg_model *m, int64_t rows)
{
    SG_TRY(sg_tensor_set_rows(m->x_static, rows));
    SG_TRY(sg_tensor_set_rows(m->t_static, rows));
    SG_TRY(sg_tensor_set_rows(m->dlogits, rows));
    return sg_module_set_rows(m->net, rows);
}

sg_status sg_model_load_padded(sg_model *m, int64_t index, int64_t rows, int64_t bucket)
{
    if (!m) return SG_ERR_NULL;
    int64_t B = m->spec.batch;
    if (!m->x_static)
        return sg_fail(m->ctx, SG_ERR_INVALID, "sg_model_load_padded: '%s' has no static inputs", m->name);
    if (rows < 1 || bucket < rows || bucket > B)
        return sg_fail(m->ctx, SG_ERR_SHAPE,
                       "sg_model_load_padded: %lld rows in a bucket of %lld: expected 1 <= rows <= "
                       "bucket <= %lld (the model's batch)", (long long)rows, (long long)bucket, (long long)B);
    SG_TRY(sg_model_load_batch(m, index)); /* gathers the full batch */
    SG_TRY(set_rows(m, bucket));
    if (rows < bucket) {
        int64_t xr = m->data->x_row, yr = m->data->y_row;
        m->x_pad->data = (char *)m->x_static->data + (size_t)(rows * xr) * 4;
        m->t_pad->data = (char *)m->t_static->data + (size_t)(rows * yr) * 4;
        SG_TRY(sg_tensor_set_rows(m->x_pad, bucket - rows));
        SG_TRY(sg_tensor_set_rows(m->t_pad, bucket - rows));
        SG_TRY(sg_tensor_fill(m->x_pad, 0.0));
        SG_TRY(sg_tensor_fill(m->t_pad, m->loss_kind == SG_LOSS_MSE ? 0.0 : -1.0));
    }
    return SG_OK;
}

/* Sequence models: every per-step tensor at Tb positions a sequence (the modules turn B*Tb
 * rows into their own shapes). */
static sg_status set_seq(sg_model *m, int64_t Tb)
{
    int64_t B = m->spec.batch;
    SG_TRY(sg_tensor_set_shape(m->x_static, 2, (int64_t[]){B, Tb}));
    SG_TRY(sg_tensor_set_shape(m->t_view, 2, (int64_t[]){B, Tb}));
    SG_TRY(sg_tensor_set_rows(m->t_static, B * Tb));
    SG_TRY(sg_tensor_set_rows(m->dlogits, B * Tb));
    SG_TRY(sg_module_set_rows(m->net, B * Tb));
    m->seq_len = Tb;
    return SG_OK;
}

/* Sequence lengths are for models over token text; fn names the caller. */
static sg_status check_text(sg_model *m, const char *fn)
{
    if (m->text) return SG_OK;
    return sg_fail(m->ctx, SG_ERR_UNSUPPORTED, "%s: '%s' has no sequence length; variable sequence "
                   "lengths are for gpt models (models over token text)", fn, m->name);
}

sg_status sg_model_set_seq(sg_model *m, int64_t Tb)
{
    if (!m) return SG_ERR_NULL;
    SG_TRY(check_text(m, "sg_model_set_seq"));
    if (Tb < 1 || Tb > m->spec.seq)
        return sg_fail(m->ctx, SG_ERR_SHAPE, "sg_model_set_seq: length %lld: expected 1 to %lld (the model's T)",
                       (long long)Tb, (long long)m->spec.seq);
    return set_seq(m, Tb);
}

sg_status sg_model_load_seq(sg_model *m, int64_t index, int64_t len, int64_t bucket)
{
    if (!m) return SG_ERR_NULL;
    SG_TRY(check_text(m, "sg_model_load_seq"));
    if (len < 1 || bucket < len || bucket > m->spec.seq)
        return sg_fail(m->ctx, SG_ERR_SHAPE, "sg_model_load_seq: %lld tokens in a bucket of %lld: expected 1 <= "
                       "tokens <= bucket <= %lld (the model's T)", (long long)len, (long long)bucket,
                       (long long)m->spec.seq);
    if (index < 0)
        return sg_fail(m->ctx, SG_ERR_INVALID, "sg_model_load_seq: batch index %lld < 0", (long long)index);
    SG_TRY(set_seq(m, bucket));
    return sg_text_batch_padded(m->text, m->split, m->data_seed, index, len, m->x_static, m->t_view);
}

sg_status sg_model_full_shape(sg_model *m)
{
    if (!m) return SG_ERR_NULL;
    if (m->text) return m->seq_len == m->spec.seq ? SG_OK : set_seq(m, m->spec.seq);
    return m->x_static ? set_rows(m, m->spec.batch) : SG_OK;
}

sg_status sg_model_set_rows(sg_model *m, int64_t rows)
{
    if (!m) return SG_ERR_NULL;
    if (m->text || !m->x_static || rows < 1 || rows > m->spec.batch)
        return sg_fail(m->ctx, SG_ERR_SHAPE, "sg_model_set_rows: %lld rows: expected 1 to %lld, for a model of "
                       "samples with static inputs", (long long)rows, (long long)m->spec.batch);
    return set_rows(m, rows);
}

sg_status sg_model_pad_vary(sg_model *m, const sg_tensor *step, const int64_t *buckets, int n_buckets,
                            sg_tensor *bucket_out)
{
    if (!m) return SG_ERR_NULL;
    if (m->text || !m->x_static)
        return sg_fail(m->ctx, SG_ERR_INVALID, "sg_model_pad_vary: '%s' is not a model of samples with static "
                       "inputs", m->name);
    return sg_dataset_pad_vary(m->ctx, step, buckets, n_buckets, m->data->x_row, m->data->y_row, m->x_static,
                               m->t_static, m->loss_kind == SG_LOSS_MSE ? 0.0 : -1.0, bucket_out);
}

/* ---- passes ---- */

sg_status sg_model_loss_pass(sg_model *m, float grad_scale)
{
    const char *prev = sg_ctx_set_module(m->ctx, "loss");
    sg_status st;
    const sg_tensor *t = m->targets;
    if (m->loss_kind == SG_LOSS_MSE) st = sg_mse(m->ctx, m->logits, t, grad_scale, m->loss, m->dlogits);
    else
        st = sg_softmax_xent_scaled(m->ctx, m->logits, t, grad_scale,
                                    m->precision == SG_DTYPE_BF16 && !m->unscaled ? m->scaler : NULL, m->loss,
                                    m->dlogits);
    sg_ctx_set_module(m->ctx, prev);
    return st;
}

sg_status sg_model_forward(sg_model *m)
{
    if (!m) return SG_ERR_NULL;
    SG_TRY(sg_module_forward(m->net, m->x, &m->logits));
    return sg_model_loss_pass(m, 1.0f);
}

sg_status sg_model_backward(sg_model *m)
{
    if (!m) return SG_ERR_NULL;
    if (!m->logits)
        return sg_fail(m->ctx, SG_ERR_INVALID, "sg_model_backward: '%s' ran no forward", m->name);
    sg_tensor *dx = NULL;
    return sg_module_backward(m->net, m->dlogits, &dx);
}

sg_status sg_model_loss_read(sg_model *m, float *out)
{
    if (!m || !out) return SG_ERR_NULL;
    return sg_tensor_copy_to_host(m->loss, out, sizeof *out);
}

sg_status sg_optim_create(sg_ctx *ctx, sg_model *m, sg_optim_kind kind, sg_optim **out)
{
    if (!ctx) return SG_ERR_NULL;
    if (!m || !out) return sg_fail(ctx, SG_ERR_NULL, "sg_optim_create: model or out is NULL");
    if (m->ctx != ctx)
        return sg_fail(ctx, SG_ERR_BACKEND, "sg_optim_create: model '%s' belongs to another context",
                       m->name);
    SG_TRY(sg_optim_create_for(ctx, m->params, kind, out));
    sg_param_set *ps = m->params;
    if (m->precision != SG_DTYPE_BF16) return SG_OK;
    /* Mixed precision: the optimizer unscales the bf16 gradients into the f32 ones, skips a
     * step whose gradients are not finite, and writes the bf16 copies with the masters; without
     * loss scaling it only reads the bf16 gradients (no scaler, no skip flag). */
    sg_status st = sg_model_set_mixed(m, *out, ps->grad_flat_lo, ps->flat_lo);
    if (st != SG_OK) {
        sg_optim_destroy(*out);
        *out = NULL;
    }
    return st;
}
