/* params.c: the parameter set. Parameters are declared first, then laid out back to back in
 * one flat F32 buffer (and gradients in a second one of the same layout), so the fused
 * optimizers update everything in one launch and no address ever moves. Initial values
 * are drawn on the host from a seed, identical for every backend. */
#include "nn/nn.h"

#include <math.h>
#include <stdlib.h>

uint64_t sg_rng_next(sg_rng *r)
{
    uint64_t z = (r->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double sg_rng_uniform(sg_rng *r) { return (sg_rng_next(r) >> 11) * (1.0 / 9007199254740992.0); }

double sg_rng_normal(sg_rng *r)
{
    double u1 = sg_rng_uniform(r), u2 = sg_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* Grows the per-parameter arrays to hold at least n entries. */
static bool params_reserve(sg_param_set *ps, int n)
{
    if (n <= ps->cap) return true;
    int cap = ps->cap ? ps->cap * 2 : 64;
    while (cap < n) cap *= 2;
    sg_param_info *info = realloc(ps->info, (size_t)cap * sizeof *info);
    if (info) ps->info = info;
    sg_tensor ***arrays[] = {&ps->param, &ps->grad, &ps->param_lo, &ps->grad_lo};
    bool ok = info != NULL;
    for (int a = 0; a < 4 && ok; a++) {
        sg_tensor **t = realloc(*arrays[a], (size_t)cap * sizeof *t);
        if (!t) ok = false;
        else {
            memset(t + ps->cap, 0, (size_t)(cap - ps->cap) * sizeof *t);
            *arrays[a] = t;
        }
    }
    if (!ok) return false; /* the arrays that grew stay valid at their new size */
    ps->cap = cap;
    return true;
}

int sg_params_declare(sg_param_set *ps, const char *name, int ndim, const int64_t *shape,
                      int decay, sg_init init, int64_t fan_in)
{
    if (ps->flat) {
        sg_fail(ps->ctx, SG_ERR_INVALID, "sg_module_param: '%s' declared after the model was built", name);
        return -1;
    }
    if (!name || !name[0] || strlen(name) >= SG_PARAM_NAME_MAX) {
        sg_fail(ps->ctx, SG_ERR_INVALID, "sg_module_param: parameter name '%.64s%s': expected 1 to %d characters",
                name ? name : "(null)", name && strlen(name) > 64 ? "..." : "", SG_PARAM_NAME_MAX - 1);
        return -1;
    }
    if (ndim < 1 || ndim > SG_MAX_DIMS || !shape) {
        sg_fail(ps->ctx, SG_ERR_SHAPE, "sg_module_param: '%s' has %d dims: expected 1 to %d", name, ndim, SG_MAX_DIMS);
        return -1;
    }
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 1 || shape[i] > ((int64_t)1 << 40) || numel > (((int64_t)1 << 40) / shape[i])) {
            sg_fail(ps->ctx, SG_ERR_SHAPE, "sg_module_param: '%s': dim %d is %lld: expected a size from 1 "
                    "and at most 2^40 elements in all", name, i, (long long)shape[i]);
            return -1;
        }
        numel *= shape[i];
    }
    if (ps->total + numel + 3 > INT32_MAX) { /* the optimizers' segment tables are int32 */
        sg_fail(ps->ctx, SG_ERR_SHAPE, "sg_module_param: '%s' takes the model past 2^31 - 1 parameters", name);
        return -1;
    }
    for (int i = 0; i < ps->count; i++)
        if (!strcmp(ps->info[i].name, name)) {
            sg_fail(ps->ctx, SG_ERR_INVALID, "sg_module_param: '%s' is declared twice: parameter names must be "
                    "unique (give the modules distinct names)", name);
            return -1;
        }
    if (!params_reserve(ps, ps->count + 1)) {
        sg_fail(ps->ctx, SG_ERR_OOM, "sg_module_param: out of host memory");
        return -1;
    }
    sg_param_info *p = &ps->info[ps->count];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = ndim;
    p->numel = numel;
    for (int i = 0; i < ndim; i++) p->shape[i] = shape[i];
    /* Align every tensor to 4 elements (16 bytes), so kernels can use vector loads. */
    p->offset = (ps->total + 3) & ~(int64_t)3;
    ps->total = p->offset + p->numel;
    p->decay = decay;
    p->init = init;
    p->fan_in = fan_in;
    return ps->count++;
}

static void init_values(const sg_param_info *p, sg_rng *r, float *dst)
{
    double bound = p->fan_in > 0 ? 1.0 / sqrt((double)p->fan_in) : 0.0;
    for (int64_t i = 0; i < p->numel; i++) {
        switch (p->init) {
        case SG_INIT_UNIFORM_FAN_IN: dst[i] = (float)((2 * sg_rng_uniform(r) - 1) * bound); break;
        case SG_INIT_ZEROS: dst[i] = 0.f; break;
        case SG_INIT_ONES: dst[i] = 1.f; break;
        case SG_INIT_NORMAL_002: dst[i] = (float)(0.02 * sg_rng_normal(r)); break;
        }
    }
}

sg_status sg_params_allocate(sg_param_set *ps, uint64_t seed)
{
    sg_ctx *ctx = ps->ctx;
    int64_t total = ps->total > 0 ? ps->total : 1;
    SG_TRY(sg_tensor_create(ctx, SG_DTYPE_F32, 1, &total, "params", &ps->flat));
    SG_TRY(sg_tensor_create(ctx, SG_DTYPE_F32, 1, &total, "grads", &ps->grad_flat));
    int64_t ns = ps->count + 1, nd = ps->count > 0 ? ps->count : 1;
    SG_TRY(sg_tensor_create(ctx, SG_DTYPE_I32, 1, &ns, "seg_start", &ps->seg_start));
    SG_TRY(sg_tensor_create(ctx, SG_DTYPE_I32, 1, &nd, "seg_decay", &ps->seg_decay));

    float *host = calloc((size_t)total, sizeof *host);
    int32_t *start = calloc((size_t)ns, sizeof *start), *decay = calloc((size_t)nd, sizeof *decay);
    if (!host || !start || !decay) {
        free(host), free(start), free(decay);
        return sg_fail(ctx, SG_ERR_OOM, "sg_params_allocate: out of host memory");
    }
    sg_rng r = {seed};
    sg_status st = SG_OK;
    for (int i = 0; i < ps->count && st == SG_OK; i++) {
        sg_param_info *p = &ps->info[i];
        init_values(p, &r, host + p->offset);
        /* Segments tile the flat buffer: alignment padding belongs to the previous one. */
        start[i] = (int32_t)(i == 0 ? 0 : p->offset);
        decay[i] = p->decay;
        char gname[SG_PARAM_NAME_MAX + 8];
        snprintf(gname, sizeof gname, "%s.grad", p->name);
        st = sg_tensor_view(ps->flat, p->offset, p->ndim, p->shape, p->name, &ps->param[i]);
        if (st == SG_OK)
            st = sg_tensor_view(ps->grad_flat, p->offset, p->ndim, p->shape, gname, &ps->grad[i]);
    }
    start[ps->count] = (int32_t)total;
    if (st == SG_OK) st = sg_tensor_copy_from_host(ps->flat, host, (size_t)total * 4);
    if (st == SG_OK) st = sg_tensor_copy_from_host(ps->seg_start, start, (size_t)ns * 4);
    if (st == SG_OK) st = sg_tensor_copy_from_host(ps->seg_decay, decay, (size_t)nd * 4);
    /* Padding gradients are never written by a backward: zero them once. */
    if (st == SG_OK) st = sg_tensor_fill(ps->grad_flat, 0.0);
    if (st == SG_OK) st = sg_ctx_sync(ctx); /* host buffers are freed next */
    free(host), free(start), free(decay);
    return st;
}

sg_status sg_params_allocate_lowp(sg_param_set *ps)
{
    sg_ctx *ctx = ps->ctx;
    int64_t total = ps->flat->numel;
    SG_TRY(sg_tensor_create(ctx, SG_DTYPE_BF16, 1, &total, "params.bf16", &ps->flat_lo));
    SG_TRY(sg_tensor_create(ctx, SG_DTYPE_BF16, 1, &total, "grads.bf16", &ps->grad_flat_lo));
    for (int i = 0; i < ps->count; i++) {
        sg_param_info *p = &ps->info[i];
        char n[SG_PARAM_NAME_MAX + 16];
        snprintf(n, sizeof n, "%s.bf16", p->name);
        SG_TRY(sg_tensor_view(ps->flat_lo, p->offset, p->ndim, p->shape, n, &ps->param_lo[i]));
        snprintf(n, sizeof n, "%s.grad.bf16", p->name);
        SG_TRY(sg_tensor_view(ps->grad_flat_lo, p->offset, p->ndim, p->shape, n, &ps->grad_lo[i]));
    }
    /* Padding gradients are never written by a backward: zero them once. */
    SG_TRY(sg_tensor_fill(ps->grad_flat_lo, 0.0));
    return sg_params_sync_lowp(ps);
}

sg_status sg_params_sync_lowp(sg_param_set *ps)
{
    return ps->flat_lo ? sg_tensor_convert(ps->flat_lo, ps->flat) : SG_OK;
}

void sg_params_release(sg_param_set *ps)
{
    for (int i = 0; i < ps->count && ps->param; i++) {
        sg_tensor_destroy(ps->param[i]);
        sg_tensor_destroy(ps->grad[i]);
        sg_tensor_destroy(ps->param_lo[i]);
        sg_tensor_destroy(ps->grad_lo[i]);
        ps->param[i] = ps->grad[i] = ps->param_lo[i] = ps->grad_lo[i] = NULL;
    }
    free(ps->info), free(ps->param), free(ps->grad), free(ps->param_lo), free(ps->grad_lo);
    ps->info = NULL, ps->param = ps->grad = ps->param_lo = ps->grad_lo = NULL;
    ps->count = ps->cap = 0;
    sg_tensor_destroy(ps->flat_lo);
    sg_tensor_destroy(ps->grad_flat_lo);
    ps->flat_lo = ps->grad_flat_lo = NULL;
    sg_tensor_destroy(ps->flat);
    sg_tensor_destroy(ps->grad_flat);
    sg_tensor_destroy(ps->seg_start);
    sg_tensor_destroy(ps->seg_decay);
    ps->flat = ps->grad_flat = ps->seg_start = ps->seg_decay = NULL;
}
