/* model.c: the public sg_model_* and sg_optim_create calls: parse a canonical name, build
 * the model kind, bind batches, run forward (loss included) and backward. */
#include "models/model.h"
#include "models/text.h"

#include <stdlib.h>

/* One field of a name: a whole number from 1 to max (sg_parse_decimal), ended by `end` ('-'
 * before another field, '\0' after the last); *p advances past it. */
static bool name_field(const char **p, int64_t max, char end, int64_t *out)
{
    const char *e = strchr(*p, end);
    if (!e || !sg_parse_decimal(*p, (size_t)(e - *p), max, out) || *out < 1) return false;
    *p = end ? e + 1 : e;
    return true;
}

sg_status sg_model_parse(sg_ctx *ctx, const char *name, sg_model_spec *out)
{
    memset(out, 0, sizeof *out);
    if (!name) return sg_fail(ctx, SG_ERR_NULL, "sg_model_create: name is NULL");
    static const char *const forms = "expected mlp-WIDTH-DEPTH-BATCH (e.g. mlp-512-6-32) or "
                                     "gpt-WIDTH-DEPTH-BATCH-SEQ (e.g. gpt-256-4-8-128)";
    /* Every field is checked whole: "mlp-64-2-33x" or "mlp-64-2-32-garbage" is not a model. */
    const char *p = name;
    int nf = 0;
    if (!strncmp(name, "mlp-", 4)) nf = 3, p += 4;
    else if (!strncmp(name, "gpt-", 4)) nf = 4, p += 4;
    if (!nf) return sg_fail(ctx, SG_ERR_INVALID, "sg_model_create: unknown model '%s': %s", name, forms);
    static const char *const what[4] = {"WIDTH", "DEPTH", "BATCH", "SEQ"};
    static const int64_t max[4] = {65536, 64, 1 << 20, 65536};
    int64_t v[4] = {0};
    for (int i = 0; i < nf; i++) {
        bool last = i == nf - 1;
        if (!name_field(&p, max[i], last ? '\0' : '-', &v[i]))
            return sg_fail(ctx, SG_ERR_INVALID, "sg_model_create: unknown model '%s': %s; %s must be a whole "
                           "number from 1 to %lld%s", name, forms, what[i], (long long)max[i],
                           last ? ", and nothing may follow it" : "");
    }
    memcpy(out->kind, name, 3);
    out->width = v[0], out->depth = v[1], out->batch = v[2], out->seq = nf == 4 ? v[3] : 0;
    return SG_OK;
}

/* The bytes building a model takes, by part (a lower bound: the allocator rounds blocks up). */
sg_status sg_model_estimate(const char *name, const sg_model_options *opts, sg_model_size *out)
{
    if (!out) return sg_fail(NULL, SG_ERR_NULL, "sg_model_estimate: out is NULL");
    memset(out, 0, sizeof *out);
    sg_model_spec spec;
    SG_TRY(sg_model_parse(NULL, name, &spec));
    sg_dtype precision = opts ? opts->precision : SG_DTYPE_F32;
    float dropout = opts ? opts->dropout : 0.f;
    if (opts && opts->shards > 1 && spec.batch % opts->shards == 0) spec.batch /= opts->shards;
    if (!strcmp(spec.kind, "gpt")) sg_gpt_estimate(&spec, precision, dropout, out);
    else sg_mlp_estimate(&spec, out);
    out->total_bytes = out->param_bytes + out->activation_bytes + out->data_bytes + out->optim_bytes;
    return SG_OK;
}

/* Refuses a model that cannot fit before allocating any of it, with both figures. */
static sg_status check_fits(sg_ctx *ctx, const char *name, const sg_model_options *opts)
{
    sg_model_size z;
    SG_TRY(sg_model_estimate(name, opts, &z));
    size_t free_b = 0, total_b = 0;
    SG_TRY(sg_ctx_mem_info(ctx, &free_b, &total_b));
    size_t need = z.param_bytes + z.activation_bytes + z.data_bytes; /* the optimizer comes later */
    if (need <= free_b) return SG_OK;
    const double gib = 1024.0 * 1024.0 * 1024.0;
    return sg_fail(ctx, SG_ERR_OOM, "sg_model_create: '%s' needs at least %.2f GiB (%lld parameters: %.2f GiB "
                   "with their gradients; activations %.2f GiB; data %.2f GiB; AdamW's state would add %.2f GiB), "
                   "and %s has %.2f GiB free of %.2f GiB", name, need / gib, (long long)z.params,
                   z.param_bytes / gib, z.activation_bytes / gib, z.data_bytes / gib, z.optim_bytes / gib,
                   sg_ctx_device_name(ctx), free_b / gib, total_b / gib);
}

void sg_model_destroy(sg_model *m)
{
    if (!m) return;
    sg_module_destroy(m->net);
    sg_text_close(m->text);
    sg_tensor *ts[] = {m->scaler, m->found, m->rng, m->gnorm, m->nonfinite, m->batch_idx, m->x_pad, m->t_pad, m->x_view, m->t_view, m->x_static, m->t_static, m->loss, m->dlogits, m->data_x, m->data_y};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) sg_tensor_destroy(ts[i]);
    for (int i = 0; i < m->n_shared; i++) sg_tensor_destroy(m->shared[i]);
    sg_params_release(&m->params);
    free(m->grad_ready);
    free(m);
}

/* The loss scaler (sg_loss_scaler on the device) and the skip flag. Built before the model,
 * which reads the scale in its loss; fp32 models keep one too, so that checkpoints of either
 * precision hold the same tensors. */
static sg_status create_scaler(sg_model *m)
{
    sg_loss_scaler s = {65536.f, 0.f, 2000.f, 0.f};
    SG_TRY(sg_tensor_create(m->ctx, SG_DTYPE_F32, 1, (int64_t[]){SG_SCALER_COUNT}, "amp.scaler", &m->scaler));
    SG_TRY(sg_tensor_copy_from_host(m->scaler, &s, sizeof s));
    SG_TRY(sg_tensor_create(m->ctx, SG_DTYPE_I32, 1, (int64_t[]){1}, "amp.found", &m->found));
    return sg_tensor_fill(m->found, 0.0);
}

/* Data parallelism: the model's part of every batch. spec.batch becomes B / shards, the rows
 * each shard builds its buffers for; global_batch keeps the name's B. */
static sg_status set_shard(sg_model *m, const sg_model_options *o)
{
    int shards = o && o->shards > 1 ? o->shards : 1, shard = o ? o->shard : 0;
    m->global_batch = m->spec.batch;
    if (o && (o->shards < 0 || shard < 0 || shard >= shards || m->spec.batch % shards))
        return sg_fail(m->ctx, SG_ERR_INVALID, "sg_model_create: shard %d of %d of '%s': expected 0 <= shard < "
                       "shards, and shards dividing the batch %lld into equal parts", o->shard, o->shards,
                       m->name, (long long)m->spec.batch);
    m->shard = shard, m->shards = shards;
    m->spec.batch /= shards;
    return SG_OK;
}

sg_status sg_model_set_grad_ready(sg_model *m, const int *first_param, int n)
{
    free(m->grad_ready);
    m->n_grad_ready = 0;
    m->grad_ready = malloc((size_t)(n > 0 ? n : 1) * sizeof *m->grad_ready);
    if (!m->grad_ready) return sg_fail(m->ctx, SG_ERR_OOM, "sg_model_create: out of host memory");
    for (int i = 0; i < n; i++) {
        int p = first_param[i];
        m->grad_ready[i] = p >= 0 && p < m->params.count ? m->params.info[p].offset : m->params.total;
    }
    m->n_grad_ready = n;
    return SG_OK;
}

sg_status sg_model_create(sg_ctx *ctx, const char *name, uint64_t seed, sg_model **out)
{
    return sg_model_create_ex(ctx, name, seed, NULL, out);
}

sg_status sg_model_create_ex(sg_ctx *ctx, const char *name, uint64_t seed,
                             const sg_model_options *opts, sg_model **out)
{
    if (!ctx) return SG_ERR_NULL;
    if (!out) return sg_fail(ctx, SG_ERR_NULL, "sg_model_create: out is NULL");
    *out = NULL;
    sg_model_spec spec;
    SG_TRY(sg_model_parse(ctx, name, &spec));
    SG_TRY(check_fits(ctx, name, opts));
    sg_model *m = calloc(1, sizeof *m);
    if (!m) return sg_fail(ctx, SG_ERR_OOM, "sg_model_create: out of host memory");
    m->ctx = ctx;
    m->spec = spec;
    m->params.ctx = ctx;
    snprintf(m->name, sizeof m->name, "%s", name);
    sg_status st = SG_OK;
    sg_alloc_stats a0, a1;
    sg_ctx_alloc_stats(ctx, &a0);
    if (opts) {
        if (!(opts->dropout >= 0.f && opts->dropout < 1.f))
            st = sg_fail(ctx, SG_ERR_INVALID, "sg_model_create: dropout %g: expected 0 <= p < 1", opts->dropout);
        m->dropout = opts->dropout;
        if (opts->precision != SG_DTYPE_F32 && opts->precision != SG_DTYPE_BF16 && st == SG_OK)
            st = sg_fail(ctx, SG_ERR_DTYPE, "sg_model_create: precision %s: expected f32 or bf16",
                         sg_dtype_name(opts->precision));
        m->precision = opts->precision;
        snprintf(m->data_path, sizeof m->data_path, "%s", opts->data_path ? opts->data_path : "");
    }
    if (st == SG_OK && (m->dropout > 0 || m->data_path[0]) && strcmp(spec.kind, "gpt"))
        st = sg_fail(ctx, SG_ERR_INVALID, "sg_model_create: data paths and dropout are for gpt models, not '%s'", name);
    if (st == SG_OK && m->precision == SG_DTYPE_BF16 && strcmp(spec.kind, "gpt"))
        st = sg_fail(ctx, SG_ERR_UNSUPPORTED, "sg_model_create: bf16 mixed precision is implemented for gpt "
                     "models; '%s' trains in f32", name);
    if (st == SG_OK) st = set_shard(m, opts);
    if (st == SG_OK) st = create_scaler(m);
    if (st == SG_OK) st = !strcmp(spec.kind, "gpt") ? sg_gpt_build(m, seed) : sg_mlp_build(m, seed);
    if (st == SG_OK) st = sg_tensor_create(ctx, SG_DTYPE_F32, 1, (int64_t[]){1}, "grad.norm", &m->gnorm);
    if (st == SG_OK) st = sg_tensor_create(ctx, SG_DTYPE_I32, 1, (int64_t[]){1}, "grad.nonfinite", &m->nonfinite);
    if (st == SG_OK) st = sg_model_load_batch(m, 0);
    sg_ctx_alloc_stats(ctx, &a1);
    m->bytes = a1.bytes_in_use - a0.bytes_in_use; /* one stream, one thread: all of it is ours */
    if (st != SG_OK) {
        sg_model_destroy(m);
        return st;
    }
    *out = m;
    return SG_OK;
}

const char *sg_model_name(const sg_model *m) { return m ? m->name : ""; }
sg_dtype sg_model_precision(const sg_model *m) { return m ? m->precision : SG_DTYPE_F32; }
int64_t sg_model_param_count(const sg_model *m)
{
    int64_t n = 0;
    for (int i = 0; m && i < m->params.count; i++) n += m->params.info[i].numel;
    return n;
}
sg_tensor *sg_model_params(sg_model *m) { return m ? m->params.flat : NULL; }
int sg_model_param_tensors(const sg_model *m) { return m ? m->params.count : 0; }
sg_status sg_model_param_info(const sg_model *m, int i, const char **name, int64_t *offset, int64_t *numel)
{
    if (!m) return SG_ERR_NULL;
    if (i < 0 || i >= m->params.count)
        return sg_fail(m->ctx, SG_ERR_INVALID, "sg_model_param_info: index %d: '%s' has %d parameter tensors", i,
                       m->name, m->params.count);
    if (name) *name = m->params.info[i].name;
    if (offset) *offset = m->params.info[i].offset;
    if (numel) *numel = m->params.info[i].numel;
    return SG_OK;
}
sg_tensor *sg_model_grads(sg_model *m) { return m ? m->params.grad_flat : NULL; }
const sg_tensor *sg_model_loss(const sg_model *m) { return m ? m->loss : NULL; }
const sg_tensor *sg_model_loss_scaler(const sg_model *m) { return m ? m->scaler : NULL; }
const sg_tensor *sg_model_logits(const sg_model *m) { return m ? m->logits : NULL; }
sg_tensor *sg_model_input(sg_model *m) { return m ? m->x : NULL; }

static sg_status set_rows(sg_model *m, int64_t rows);

/* Eager steps rebind the input views to the batch in place: no copy, no launch. Captured
 * steps need fixed addresses: the batch is copied into the static inputs (two device copies). */
sg_status sg_model_load_batch(sg_model *m, int64_t index)
{
    if (!m) return SG_ERR_NULL;
    if (index < 0)
        return sg_fail(m->ctx, SG_ERR_INVALID, "sg_model_load_batch: batch index %lld < 0",
                       (long long)index);
    if (m->text) {
        SG_TRY(sg_model_full_shape(m)); /* a padded step may have left a shorter length */
        return sg_text_batch_host(m->text, m->split, m->data_seed, index, m->x_static, m->t_view);
    }
    int64_t i = index % m->n_batches;
    m->x_view->data = (char *)m->data_x->data + (size_t)(i * m->x_view->numel) * sizeof(float);
    m->t_view->data = (char *)m->data_y->data + (size_t)(i * m->t_view->numel) * sizeof(int32_t);
    if (!m->x_static) return SG_OK;
    SG_TRY(sg_model_full_shape(m)); /* a padded step may have left fewer rows */
    SG_TRY(sg_model_set_batch_index(m, index));
    return sg_model_gather_batch(m);
}

sg_status sg_model_set_batch_index(sg_model *m, int64_t index)
{
    int32_t i = (int32_t)(m->text ? index : index % m->n_batches);
    return sg_tensor_write_small(m->batch_idx, 0, &i, sizeof i);
}

typedef struct gather_args {
    sg_model *m;
    bool advance;
} gather_args;

static sg_status gather_cpu(sg_ctx *ctx, const void *p)
{
    const gather_args *a = p;
    sg_model *m = a->m;
    int32_t *idx = m->batch_idx->data;
    if (a->advance) {
        *idx += 1;
        return SG_OK;
    }
    int64_t b = ((int64_t)*idx % m->n_batches + m->n_batches) % m->n_batches;
    memcpy(m->x_static->data, (const float *)m->data_x->data + b * m->x_static->numel,
           sg_tensor_nbytes(m->x_static));
    memcpy(m->t_static->data, (const int32_t *)m->data_y->data + b * m->t_static->numel,
           sg_tensor_nbytes(m->t_static));
    return SG_OK;
}

sg_status sg_model_gather_batch(sg_model *m)
{
    if (m->text) return sg_text_batch_device(m->text, 0, m->data_seed, m->batch_idx, m->x_static, m->t_view);
    if (m->ctx->backend == SG_BACKEND_CPU)
        return sg_cpu_run(m->ctx, gather_cpu, &(gather_args){m, false}, sizeof(gather_args));
    return SG_CUDA_DISPATCH(m->ctx, sg_gather_batch_cuda(m));
}

sg_status sg_model_advance_batch(sg_model *m)
{
    if (m->ctx->backend == SG_BACKEND_CPU)
        return sg_cpu_run(m->ctx, gather_cpu, &(gather_args){m, true}, sizeof(gather_args));
    return SG_CUDA_DISPATCH(m->ctx, sg_advance_batch_cuda(m));
}

sg_status sg_model_use_static_inputs(sg_model *m)
{
    if (m->x_static) return SG_OK; /* (gpt models are built with them) */
    sg_alloc_stats a0, a1;
    sg_ctx_alloc_stats(m->ctx, &a0);
    SG_TRY(sg_tensor_create(m->ctx, SG_DTYPE_F32, m->x_view->ndim, m->x_view->shape, "input.static", &m->x_static));
    SG_TRY(sg_tensor_create(m->ctx, SG_DTYPE_I32, m->t_view->ndim, m->t_view->shape, "targets.static", &m->t_static));
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
    int64_t B = m->x_view->cap_rows;
    if (!m->x_static)
        return sg_fail(m->ctx, SG_ERR_INVALID, "sg_model_load_padded: '%s' has no static inputs", m->name);
    if (rows < 1 || bucket < rows || bucket > B)
        return sg_fail(m->ctx, SG_ERR_SHAPE,
                       "sg_model_load_padded: %lld rows in a bucket of %lld: expected 1 <= rows <= "
                       "bucket <= %lld (the model's batch)", (long long)rows, (long long)bucket, (long long)B);
    SG_TRY(sg_model_load_batch(m, index)); /* rebinds the views; copies the full batch */
    SG_TRY(set_rows(m, bucket));
    if (rows < bucket) {
        int64_t W = m->x_static->shape[1];
        m->x_pad->data = (char *)m->x_static->data + (size_t)(rows * W) * sizeof(float);
        m->t_pad->data = (char *)m->t_static->data + (size_t)rows * sizeof(int32_t);
        SG_TRY(sg_tensor_set_rows(m->x_pad, bucket - rows));
        SG_TRY(sg_tensor_set_rows(m->t_pad, bucket - rows));
        SG_TRY(sg_tensor_fill(m->x_pad, 0.0));
        SG_TRY(sg_tensor_fill(m->t_pad, -1.0));
    }
    return SG_OK;
}

/* gpt: every per-step tensor at Tb positions a sequence (the modules turn B*Tb rows into
 * their own shapes). */
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

/* Sequence lengths are for gpt models (they have a text and a T); fn names the caller. */
static sg_status check_gpt(sg_model *m, const char *fn)
{
    if (m->text) return SG_OK;
    return sg_fail(m->ctx, SG_ERR_UNSUPPORTED, "%s: '%s' has no sequence length; variable sequence "
                   "lengths are for gpt models", fn, m->name);
}

sg_status sg_model_set_seq(sg_model *m, int64_t Tb)
{
    if (!m) return SG_ERR_NULL;
    SG_TRY(check_gpt(m, "sg_model_set_seq"));
    if (Tb < 1 || Tb > m->spec.seq)
        return sg_fail(m->ctx, SG_ERR_SHAPE, "sg_model_set_seq: length %lld: expected 1 to %lld (the model's T)",
                       (long long)Tb, (long long)m->spec.seq);
    return set_seq(m, Tb);
}

sg_status sg_model_load_seq(sg_model *m, int64_t index, int64_t len, int64_t bucket)
{
    if (!m) return SG_ERR_NULL;
    SG_TRY(check_gpt(m, "sg_model_load_seq"));
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
    return m->x_static ? set_rows(m, m->x_view->cap_rows) : SG_OK;
}

sg_status sg_model_forward(sg_model *m)
{
    if (!m) return SG_ERR_NULL;
    SG_TRY(sg_module_forward(m->net, m->x, &m->logits));
    return sg_softmax_xent_scaled(m->ctx, m->logits, m->targets, 1.0f,
                                  m->precision == SG_DTYPE_BF16 ? m->scaler : NULL, m->loss, m->dlogits);
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
    SG_TRY(sg_optim_create_for(ctx, &m->params, kind, out));
    sg_param_set *ps = &m->params;
    if (m->precision != SG_DTYPE_BF16) return SG_OK;
    /* Mixed precision: the optimizer unscales the bf16 gradients into the f32 ones, skips a
     * step whose gradients are not finite, and writes the bf16 copies with the masters. */
    sg_status st = sg_optim_set_mixed(*out, ps->grad_flat_lo, m->scaler, m->found, ps->flat_lo);
    if (st != SG_OK) {
        sg_optim_destroy(*out);
        *out = NULL;
    }
    return st;
}
