/* model.c: the built-in model kinds, one table: how a canonical name parses, what a kind
 * supports, how big it is (sg_model_estimate) and how it builds (sg_model_create_ex). Every
 * kind is made from the public builder and modules, as a user's model is. */
#include "models/model.h"

#include <stdbool.h>
#include <stdio.h>

typedef struct kind {
    const char *prefix;        /* "mlp-" */
    int fields;                /* WIDTH-DEPTH-BATCH[-SEQ], or BATCH-R for images */
    int images;                /* the fields are BATCH-R; depth is `variant` */
    int64_t variant;
    const char *form;
    sg_model_traits traits;
    sg_status (*build)(sg_ctx *, const char *, const sg_kind_spec *, const sg_model_options *, uint64_t,
                       sg_model **);
} kind;

static const kind kinds[] = {
    {"mlp-", 3, 0, 0, "mlp-WIDTH-DEPTH-BATCH (e.g. mlp-512-6-32)", {0, 0, 0}, sg_mlp_build},
    {"gpt-", 4, 0, 0, "gpt-WIDTH-DEPTH-BATCH-SEQ (e.g. gpt-256-4-8-128)", {1, 1, 1}, sg_gpt_build},
    {"resnet18-", 2, 1, 18, "resnet18-BATCH-R (e.g. resnet18-32-32)", {0, 1, 0}, sg_resnet_build},
    {"resnet34-", 2, 1, 34, "resnet34-BATCH-R", {0, 1, 0}, sg_resnet_build},
    {"resnet50-", 2, 1, 50, "resnet50-BATCH-R (e.g. resnet50-32-224)", {0, 1, 0}, sg_resnet_build},
    {"efficientnet_b0-", 2, 1, 0, "efficientnet_b0-BATCH-R (e.g. efficientnet_b0-32-224)", {0, 1, 0},
     sg_efficientnet_build},
};
#define N_KINDS ((int)(sizeof kinds / sizeof *kinds))

/* A whole number from 1 to max: decimal digits only, no sign, space or leading zero. */
static bool field(const char *s, size_t n, int64_t max, int64_t *out)
{
    if (n == 0 || n > 19 || s[0] == '0') return false;
    int64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        v = v * 10 + (s[i] - '0');
        if (v > max) return false;
    }
    *out = v;
    return true;
}

/* name -> its kind and fields; SG_ERR_INVALID with every accepted form, the message on ctx
 * (or the thread's creation message when ctx is NULL). */
static sg_status parse(sg_ctx *ctx, const char *name, const kind **k, sg_kind_spec *out)
{
    memset(out, 0, sizeof *out);
    if (!name) return sg_ctx_fail(ctx, SG_ERR_NULL, "sg_model_create: name is NULL");
    char forms[512] = "expected ";
    for (int i = 0; i < N_KINDS; i++)
        snprintf(forms + strlen(forms), sizeof forms - strlen(forms), "%s%s", i ? " or " : "", kinds[i].form);
    *k = NULL;
    for (int i = 0; i < N_KINDS && !*k; i++)
        if (!strncmp(name, kinds[i].prefix, strlen(kinds[i].prefix))) *k = &kinds[i];
    if (!*k) return sg_ctx_fail(ctx, SG_ERR_INVALID, "sg_model_create: unknown model '%s': %s", name, forms);
    static const char *const what_seq[4] = {"WIDTH", "DEPTH", "BATCH", "SEQ"}, *const what_img[2] = {"BATCH", "R"};
    static const int64_t max_seq[4] = {65536, 64, 1 << 20, 65536}, max_img[2] = {1 << 20, 4096};
    const char *const *what = (*k)->images ? what_img : what_seq;
    const int64_t *max = (*k)->images ? max_img : max_seq;
    int64_t v[4] = {0};
    const char *p = name + strlen((*k)->prefix);
    for (int i = 0; i < (*k)->fields; i++) {
        bool last = i == (*k)->fields - 1;
        const char *e = last ? p + strlen(p) : strchr(p, '-');
        if (!e || !field(p, (size_t)(e - p), max[i], &v[i]))
            return sg_ctx_fail(ctx, SG_ERR_INVALID, "sg_model_create: unknown model '%s': %s; %s must be a whole "
                               "number from 1 to %lld%s", name, forms, what[i], (long long)max[i],
                               last ? ", and nothing may follow it" : "");
        p = e + (last ? 0 : 1);
    }
    if ((*k)->images) out->batch = v[0], out->width = v[1], out->depth = (*k)->variant;
    else out->width = v[0], out->depth = v[1], out->batch = v[2], out->seq = (*k)->fields == 4 ? v[3] : 0;
    return SG_OK;
}

sg_status sg_model_kind_traits(const char *name, sg_model_traits *out)
{
    if (!out) return sg_ctx_fail(NULL, SG_ERR_NULL, "sg_model_kind_traits: out is NULL");
    const kind *k;
    sg_kind_spec s;
    SG_KIND_TRY(parse(NULL, name, &k, &s));
    *out = k->traits;
    return SG_OK;
}

sg_builder_options sg_kind_builder_options(const sg_model_options *o, int64_t batch)
{
    sg_builder_options bo = sg_builder_options_default();
    bo.batch = batch;
    if (!o) return bo;
    bo.precision = o->precision;
    bo.loss_scaling = o->loss_scaling;
    bo.shard = o->shard, bo.shards = o->shards;
    return bo;
}

/* The bytes building a model takes, by part (a lower bound: the allocator rounds blocks up). */
sg_status sg_model_estimate(const char *name, const sg_model_options *opts, sg_model_size *out)
{
    if (!out) return sg_ctx_fail(NULL, SG_ERR_NULL, "sg_model_estimate: out is NULL");
    memset(out, 0, sizeof *out);
    const kind *k;
    sg_kind_spec spec;
    SG_KIND_TRY(parse(NULL, name, &k, &spec));
    sg_dtype precision = opts ? opts->precision : SG_DTYPE_F32;
    float dropout = opts ? opts->dropout : 0.f;
    int shards = opts && opts->shards > 1 && spec.batch % opts->shards == 0 ? opts->shards : 1;
    spec.batch /= shards;
    spec.recompute = opts && opts->recompute;
    if (k->build == sg_gpt_build) sg_gpt_estimate(&spec, precision, dropout, opts ? opts->vocab : 0, out);
    else if (k->build == sg_efficientnet_build) sg_efficientnet_estimate(&spec, sg_image_classes(opts), out);
    else if (k->images) sg_resnet_estimate(&spec, sg_image_classes(opts), out);
    else sg_mlp_estimate(&spec, shards, out);
    /* A digits file replaces the synthetic images: each line an R x R x 3 image and a label. */
    if (k->images && opts && opts->data_path && opts->data_path[0])
        out->data_bytes = (size_t)sg_digits_count(opts->data_path) * (size_t)(spec.width * spec.width * 3 + 1) * 4;
    /* Image models estimate f32; under bf16 their activations take half, and the parameters'
     * and gradients' bf16 copies 4 bytes per parameter more. */
    if (k->images && precision == SG_DTYPE_BF16)
        out->activation_bytes /= 2, out->param_bytes += (size_t)out->params * 4;
    out->total_bytes = out->param_bytes + out->activation_bytes + out->data_bytes + out->optim_bytes;
    return SG_OK;
}

/* Refuses a model that cannot fit before allocating any of it, with both figures. */
static sg_status check_fits(sg_ctx *ctx, const char *name, const sg_model_options *opts)
{
    sg_model_size z;
    SG_KIND_TRY(sg_model_estimate(name, opts, &z));
    size_t free_b = 0, total_b = 0;
    SG_KIND_TRY(sg_ctx_mem_info(ctx, &free_b, &total_b));
    size_t need = z.param_bytes + z.activation_bytes + z.data_bytes; /* the optimizer comes later */
    if (need <= free_b) return SG_OK;
    const double gib = 1024.0 * 1024.0 * 1024.0;
    return sg_ctx_fail(ctx, SG_ERR_OOM, "sg_model_create: '%s' needs at least %.2f GiB (%lld parameters: %.2f GiB "
                       "with their gradients; activations %.2f GiB; data %.2f GiB; AdamW's state would add %.2f "
                       "GiB), and %s has %.2f GiB free of %.2f GiB", name, need / gib, (long long)z.params,
                       z.param_bytes / gib, z.activation_bytes / gib, z.data_bytes / gib, z.optim_bytes / gib,
                       sg_ctx_device_name(ctx), free_b / gib, total_b / gib);
}

/* What the options ask of a kind that does not do it. */
static sg_status check_options(sg_ctx *ctx, const char *name, const kind *k, const sg_model_options *o)
{
    if (!o) return SG_OK;
    if (!(o->dropout >= 0.f && o->dropout < 1.f))
        return sg_ctx_fail(ctx, SG_ERR_INVALID, "sg_model_create: dropout %g: expected 0 <= p < 1", o->dropout);
    if (o->precision != SG_DTYPE_F32 && o->precision != SG_DTYPE_BF16)
        return sg_ctx_fail(ctx, SG_ERR_DTYPE, "sg_model_create: precision %s: expected f32 or bf16",
                           sg_dtype_name(o->precision));
    bool text = (o->val_data_path && o->val_data_path[0]) || o->vocab;
    bool data = o->data_path && o->data_path[0];
    if ((text || o->dropout > 0 || (data && !k->images)) && !k->traits.sequence)
        return sg_ctx_fail(ctx, SG_ERR_INVALID, "sg_model_create: a validation file, vocab and dropout are for gpt "
                           "models, a data path for gpt and image models (a digits file), not '%s'", name);
    if (o->classes && !k->images)
        return sg_ctx_fail(ctx, SG_ERR_INVALID, "sg_model_create: classes are for image models (resnet, efficientnet), "
                           "not '%s'", name);
    if (o->classes < 0 || o->classes > (1 << 20))
        return sg_ctx_fail(ctx, SG_ERR_INVALID, "sg_model_create: %lld classes: expected 1 to %d",
                           (long long)o->classes, 1 << 20);
    if (o->precision == SG_DTYPE_BF16 && !k->traits.mixed_precision)
        return sg_ctx_fail(ctx, SG_ERR_UNSUPPORTED, "sg_model_create: bf16 mixed precision is implemented for gpt "
                           "models; '%s' trains in f32", name);
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
    if (!out) return sg_ctx_fail(ctx, SG_ERR_NULL, "sg_model_create: out is NULL");
    *out = NULL;
    const kind *k;
    sg_kind_spec spec;
    SG_KIND_TRY(parse(ctx, name, &k, &spec));
    SG_KIND_TRY(check_options(ctx, name, k, opts));
    SG_KIND_TRY(check_fits(ctx, name, opts));
    return k->build(ctx, name, &spec, opts, seed, out);
}
