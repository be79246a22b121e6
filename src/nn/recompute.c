/* recompute.c: activation recompute. Modules made between sg_builder_begin_recompute and
 * sg_module_recompute form a region; the buffers they ask for (sg_module_buffer: activations
 * and backward scratch) get no storage of their own but a place in one arena that every region
 * of the model shares, bound when the model is built (sg_builder_bind_recompute), the arena as
 * large as the largest region. The wrapper's forward runs the region's root and copies its
 * output out of the arena (the next region overwrites it); its backward runs the root's forward
 * again on the saved input, then its backward, and copies the input gradient out of the arena
 * when it lies there. Memory: every region's buffers but the largest's; time: one more forward
 * of each region a step. The regions run one at a time on one stream, captured or not, so the
 * arena is never in use by two at once. */
#include "nn/nn.h"

#include <stdlib.h>

struct sg_rc_buffer {
    sg_tensor *t;
    int region;
    size_t offset; /* bytes into the region's part of the arena */
};

#define RC_ALIGN 256 /* every buffer starts on the alignment the allocator gives its blocks */

sg_status sg_builder_begin_recompute(sg_builder *b)
{
    if (!b) return SG_ERR_NULL;
    if (b->finished)
        return sg_fail(b->ctx, SG_ERR_INVALID, "sg_builder_begin_recompute: '%s' is already built", b->name);
    if (b->rc_open >= 0)
        return sg_fail(b->ctx, SG_ERR_INVALID, "sg_builder_begin_recompute: '%s': region %d is still open (regions "
                       "do not nest: close it with sg_module_recompute first)", b->name, b->rc_open);
    size_t *bytes = realloc(b->rc_bytes, (size_t)(b->n_regions + 1) * sizeof *bytes);
    if (!bytes) return sg_fail(b->ctx, SG_ERR_OOM, "sg_builder_begin_recompute: out of host memory");
    b->rc_bytes = bytes;
    bytes[b->n_regions] = 0;
    b->rc_open = b->n_regions++;
    b->rc_first_made = b->n_made;
    return SG_OK;
}

sg_status sg_recompute_buffer(sg_module *mod, sg_dtype dt, const char *name, int ndim, const int64_t *shape,
                              sg_tensor **out)
{
    sg_builder *b = mod->b;
    if (b->n_rc == b->cap_rc) {
        int cap = b->cap_rc ? 2 * b->cap_rc : 64;
        struct sg_rc_buffer *r = realloc(b->rc, (size_t)cap * sizeof *r);
        if (!r) return sg_fail(mod->ctx, SG_ERR_OOM, "sg_module_recompute: out of host memory");
        b->rc = r, b->cap_rc = cap;
    }
    SG_TRY(sg_tensor_unbound(mod->ctx, dt, ndim, shape, name, out));
    size_t at = b->rc_bytes[mod->region], n = sg_tensor_nbytes(*out);
    b->rc[b->n_rc++] = (struct sg_rc_buffer){*out, mod->region, at};
    b->rc_bytes[mod->region] = at + (n + RC_ALIGN - 1) / RC_ALIGN * RC_ALIGN;
    return SG_OK;
}

sg_status sg_builder_bind_recompute(sg_builder *b)
{
    if (b->rc_open >= 0)
        return sg_fail(b->ctx, SG_ERR_INVALID, "sg_builder_finish: '%s': recompute region %d was opened "
                       "(sg_builder_begin_recompute) and never closed by sg_module_recompute", b->name, b->rc_open);
    if (b->rc_broken)
        return sg_fail(b->ctx, SG_ERR_INVALID, "sg_builder_finish: '%s': a module made inside a recompute region "
                       "was destroyed before the model was built; its region cannot be placed", b->name);
    if (!b->n_rc) return SG_OK;
    size_t most = 0;
    for (int r = 0; r < b->n_regions; r++)
        if (b->rc_bytes[r] > most) most = b->rc_bytes[r];
    int64_t elems = (int64_t)((most + sizeof(float) - 1) / sizeof(float));
    SG_TRY(sg_tensor_create(b->ctx, SG_DTYPE_F32, 1, &elems, "recompute.arena", &b->arena));
    for (int i = 0; i < b->n_rc; i++) sg_tensor_bind(b->rc[i].t, b->arena, b->rc[i].offset);
    free(b->rc); /* placed: the modules own the tensors */
    b->rc = NULL, b->n_rc = b->cap_rc = 0;
    return SG_OK;
}

/* ---- the wrapper ---- */

typedef struct rc_module {
    sg_module base;
    sg_module *inner;
    int region;
    const sg_tensor *x;
    sg_tensor *y;        /* the region's output, out of the arena (made by the first forward) */
    sg_tensor *dx;       /* the input gradient, out of the arena: shared with every second region */
} rc_module;

static bool in_arena(const sg_builder *b, const sg_tensor *t)
{
    if (!b->arena || !t) return false;
    const char *a = b->arena->data, *p = t->data;
    return p >= a && p < a + sg_tensor_nbytes(b->arena);
}

/* A tensor like t ((rows, ...) of its dtype) for the wrapper's y, or the input gradient buffer
 * shared by regions of one parity and shape (a region's dx is the previous one's dy, so two
 * alternate, as the GPT blocks' do). Made on the first forward: the model's build runs one. */
static sg_status make_like(rc_module *r, const sg_tensor *t, bool grad, sg_tensor **out)
{
    sg_module *m = &r->base;
    int64_t shape[SG_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    shape[0] = t->cap_rows;
    if (!grad) return sg_module_buffer_kept(m, t->dtype, "y", t->ndim, shape, out);
    char n[SG_MODULE_NAME_MAX];
    int k = snprintf(n, sizeof n, "recompute.dx.%s.%d", sg_dtype_name(t->dtype), r->region % 2);
    for (int d = 0; d < t->ndim && k < (int)sizeof n; d++) k += snprintf(n + k, sizeof n - k, "x%lld", (long long)shape[d]);
    *out = sg_builder_shared(m->b, n, t->dtype, t->ndim, shape);
    return *out ? SG_OK : SG_ERR_INVALID; /* the message is set */
}

/* dst's first rows set to src's, then src copied in. */
static sg_status copy_rows(sg_tensor *dst, const sg_tensor *src)
{
    if (dst->shape[0] != src->shape[0]) SG_TRY(sg_tensor_set_rows(dst, src->shape[0]));
    return sg_tensor_copy(dst, src);
}

static sg_status rc_forward(sg_module *m, const sg_tensor *x, const sg_tensor **y)
{
    rc_module *r = (rc_module *)m;
    const sg_tensor *h = NULL;
    SG_TRY(sg_module_forward(r->inner, x, &h));
    r->x = x;
    if (!r->dx && !m->no_input_grad) SG_TRY(make_like(r, x, true, &r->dx));
    if (!in_arena(m->b, h)) { /* a tensor the inner module keeps itself */
        *y = h;
        return SG_OK;
    }
    if (!r->y) SG_TRY(make_like(r, h, false, &r->y));
    SG_TRY(copy_rows(r->y, h));
    *y = r->y;
    return SG_OK;
}

static sg_status rc_backward(sg_module *m, sg_tensor *dy, sg_tensor **dx)
{
    rc_module *r = (rc_module *)m;
    if (!r->x) return sg_module_no_forward(m);
    const sg_tensor *h = NULL;
    m->b->recomputing = true; /* sg_module_updates_buffers: the buffers moved in the first forward */
    sg_status st = sg_module_forward(r->inner, r->x, &h);
    m->b->recomputing = false;
    SG_TRY(st);
    sg_tensor *g = NULL;
    SG_TRY(sg_module_backward(r->inner, dy, &g));
    if (m->no_input_grad || !g) {
        *dx = m->no_input_grad ? NULL : g;
        return SG_OK;
    }
    if (!in_arena(m->b, g)) {
        *dx = g;
        return SG_OK;
    }
    if (!r->dx) return sg_module_no_dx(m);
    SG_TRY(copy_rows(r->dx, g));
    *dx = r->dx;
    return SG_OK;
}

static void rc_destroy(sg_module *m)
{
    rc_module *r = (rc_module *)m;
    sg_module_free(r->inner);
    sg_tensor_destroy(r->y); /* dx is the builder's (shared) */
    free(r);
}

static sg_status rc_set_rows(sg_module *m, int64_t rows)
{
    rc_module *r = (rc_module *)m;
    return sg_module_set_rows(r->inner, rows); /* y and dx follow the tensors they copy */
}

static sg_status rc_finish(sg_module *m)
{
    rc_module *r = (rc_module *)m;
    r->inner->no_input_grad = m->no_input_grad;
    return sg_module_finish(r->inner);
}

static const sg_module_i rc_i = {"recompute", rc_forward, rc_backward, rc_destroy, rc_set_rows, rc_finish};

sg_status sg_module_recompute(sg_builder *b, const char *name, sg_module *inner, sg_module **m)
{
    if (!b) return SG_ERR_NULL;
    if (!m || !inner) return sg_fail(b->ctx, SG_ERR_NULL, "sg_module_recompute: '%s': inner or m is NULL",
                                     name ? name : "");
    *m = NULL;
    int region = b->rc_open;
    if (region < 0)
        return sg_fail(b->ctx, SG_ERR_INVALID, "sg_module_recompute: '%s': no region is open (call "
                       "sg_builder_begin_recompute before making the modules it recomputes)", name ? name : "");
    if (inner->b != b || inner->region != region)
        return sg_fail(b->ctx, SG_ERR_INVALID, "sg_module_recompute: '%s': '%s' was not made in the open region "
                       "(between sg_builder_begin_recompute and this call)", name ? name : "",
                       sg_module_label(inner));
    /* Every module of the region but inner belongs to it (inner's tree): nothing made there
     * is left for another container, whose passes would run outside the region's. */
    for (int i = b->rc_first_made; i < b->n_made; i++) {
        sg_module *o = b->made[i];
        if (o != inner && !o->owned)
            return sg_fail(b->ctx, SG_ERR_INVALID, "sg_module_recompute: '%s': '%s' was made in the region but "
                           "does not belong to '%s': a region holds one module (a container of the others)",
                           name ? name : "", sg_module_label(o), sg_module_label(inner));
    }
    b->rc_open = -1;
    rc_module *r = calloc(1, sizeof *r);
    if (!r) return sg_fail(b->ctx, SG_ERR_OOM, "sg_module_recompute: out of host memory");
    SG_TRY(sg_module_init(b, &r->base, &rc_i, name));
    SG_TRY(sg_module_adopt(&r->base, &inner, 1));
    r->inner = inner;
    r->region = region;
    *m = &r->base;
    return SG_OK;
}
