/* builder.c: the builder that modules are made from (the public sg_builder): options, name
 * scopes, parameter declaration by module, shared scratch, dropout's generator, the list of
 * modules made (so an abandoned build frees them all), and modules of a user's own, which
 * run through their public sg_module_ops. sg_builder_finish, which makes the model, is in
 * models/. */
#include "nn/nn.h"

#include <stdlib.h>

sg_builder_options sg_builder_options_default(void)
{
    sg_builder_options o;
    memset(&o, 0, sizeof o);
    o.batch = 1;
    o.precision = SG_DTYPE_F32;
    return o;
}

sg_status sg_builder_create(sg_ctx *ctx, const char *name, const sg_builder_options *opts,
                            sg_builder **out)
{
    if (!ctx) return SG_ERR_NULL;
    if (!out) return sg_fail(ctx, SG_ERR_NULL, "sg_builder_create: out is NULL");
    *out = NULL;
    sg_builder_options o = opts ? *opts : sg_builder_options_default();
    if (!name || !name[0] || strlen(name) >= sizeof ((sg_builder *)0)->name)
        return sg_fail(ctx, SG_ERR_INVALID, "sg_builder_create: model name '%s': expected 1 to 63 characters",
                       name ? name : "(null)");
    if (o.batch < 1 || o.batch > (1 << 24) || o.seq < 0 || o.seq > (1 << 20))
        return sg_fail(ctx, SG_ERR_SHAPE, "sg_builder_create: '%s': batch %lld and seq %lld: expected a batch "
                       "from 1 to 2^24 and seq from 0 (no sequence) to 2^20", name, (long long)o.batch,
                       (long long)o.seq);
    if (o.precision != SG_DTYPE_F32 && o.precision != SG_DTYPE_BF16)
        return sg_fail(ctx, SG_ERR_DTYPE, "sg_builder_create: '%s': precision %s: expected f32 or bf16", name,
                       sg_dtype_name(o.precision));
    if (o.loss_scaling != SG_LOSS_SCALING_DYNAMIC && o.loss_scaling != SG_LOSS_SCALING_NONE)
        return sg_fail(ctx, SG_ERR_INVALID, "sg_builder_create: '%s': loss_scaling %d: expected "
                       "SG_LOSS_SCALING_DYNAMIC (0) or SG_LOSS_SCALING_NONE (1)", name, (int)o.loss_scaling);
    if (!(o.dropout >= 0.f && o.dropout < 1.f))
        return sg_fail(ctx, SG_ERR_INVALID, "sg_builder_create: '%s': dropout %g: expected 0 <= p < 1", name,
                       o.dropout);
    int shards = o.shards > 1 ? o.shards : 1;
    if (o.shards < 0 || o.shard < 0 || o.shard >= shards || o.batch % shards)
        return sg_fail(ctx, SG_ERR_INVALID, "sg_builder_create: shard %d of %d of '%s': expected 0 <= shard < "
                       "shards, and shards dividing the batch %lld into equal parts", o.shard, o.shards, name,
                       (long long)o.batch);
    sg_builder *b = calloc(1, sizeof *b);
    if (!b) return sg_fail(ctx, SG_ERR_OOM, "sg_builder_create: out of host memory");
    b->ctx = ctx;
    snprintf(b->name, sizeof b->name, "%s", name);
    b->opts = o;
    b->opts.shards = shards;
    b->batch = o.batch / shards;
    b->rows = b->batch * (o.seq > 0 ? o.seq : 1);
    b->params.ctx = ctx;
    b->bufs.ctx = ctx;
    b->rc_open = -1;
    sg_alloc_stats a;
    sg_ctx_alloc_stats(ctx, &a);
    b->bytes0 = a.bytes_in_use; /* the model's bytes: what its modules, data and buffers take */
    *out = b;
    return SG_OK;
}

void sg_builder_release(sg_builder *b)
{
    if (!b) return;
    for (int i = 0; i < b->n_shared; i++) sg_tensor_destroy(b->shared[i].t);
    free(b->shared);
    sg_tensor_destroy(b->rng);
    sg_tensor_destroy(b->arena);
    free(b->rc_bytes);
    free(b->rc);
    sg_params_release(&b->params);
    sg_params_release(&b->bufs);
    free(b->made);
    free(b);
}

void sg_builder_destroy(sg_builder *b)
{
    if (!b) return;
    /* Containers free their children: free only the modules nobody owns. A child is always
     * made before its container, so it is checked while still alive. */
    b->finished = true; /* (no more bookkeeping in sg_module_destroy) */
    for (int i = 0; i < b->n_made; i++)
        if (!b->made[i]->owned) b->made[i]->vt->destroy(b->made[i]);
    sg_builder_release(b);
}

sg_ctx *sg_builder_ctx(const sg_builder *b) { return b ? b->ctx : NULL; }
int64_t sg_builder_rows(const sg_builder *b) { return b ? b->rows : 0; }
sg_dtype sg_builder_dtype(const sg_builder *b) { return b ? b->opts.precision : SG_DTYPE_F32; }

sg_status sg_builder_push_scope(sg_builder *b, const char *scope)
{
    if (!b) return SG_ERR_NULL;
    if (!scope || !scope[0])
        return sg_fail(b->ctx, SG_ERR_INVALID, "sg_builder_push_scope: the scope name is empty");
    size_t n = strlen(b->scope), k = strlen(scope);
    if (n + k + 2 > sizeof b->scope)
        return sg_fail(b->ctx, SG_ERR_INVALID, "sg_builder_push_scope: '%s.%s' is longer than %zu characters",
                       b->scope, scope, sizeof b->scope - 1);
    if (b->scope_depth == (int)(sizeof b->scope_at / sizeof *b->scope_at))
        return sg_fail(b->ctx, SG_ERR_INVALID, "sg_builder_push_scope: more than %d nested scopes",
                       (int)(sizeof b->scope_at / sizeof *b->scope_at));
    b->scope_at[b->scope_depth++] = (unsigned short)n;
    if (n) b->scope[n++] = '.';
    memcpy(b->scope + n, scope, k + 1);
    return SG_OK;
}

void sg_builder_pop_scope(sg_builder *b)
{
    if (!b || !b->scope_depth) return;
    b->scope[b->scope_at[--b->scope_depth]] = '\0'; /* the whole of the last push, dots and all */
}

sg_tensor *sg_builder_shared(sg_builder *b, const char *name, sg_dtype dt, int ndim, const int64_t *shape)
{
    if (!b || !name) return NULL;
    for (int i = 0; i < b->n_shared; i++) {
        if (strcmp(b->shared[i].name, name)) continue;
        sg_tensor *t = b->shared[i].t;
        bool same = t->dtype == dt && t->ndim == ndim;
        for (int d = 0; same && d < ndim; d++) same = t->shape[d] == shape[d];
        if (same) return t;
        sg_fail(b->ctx, SG_ERR_SHAPE, "sg_builder_shared: '%s' was made with another dtype or shape", name);
        return NULL;
    }
    if (strlen(name) >= SG_MODULE_NAME_MAX) {
        sg_fail(b->ctx, SG_ERR_INVALID, "sg_builder_shared: name '%.40s...' is too long", name);
        return NULL;
    }
    if (b->n_shared == b->cap_shared) {
        int cap = b->cap_shared ? 2 * b->cap_shared : 16;
        sg_shared_buf *s = realloc(b->shared, (size_t)cap * sizeof *s);
        if (!s) {
            sg_fail(b->ctx, SG_ERR_OOM, "sg_builder_shared: out of host memory");
            return NULL;
        }
        b->shared = s, b->cap_shared = cap;
    }
    sg_tensor *t = NULL;
    if (sg_tensor_create(b->ctx, dt, ndim, shape, name, &t) != SG_OK) return NULL;
    sg_shared_buf *s = &b->shared[b->n_shared++];
    snprintf(s->name, sizeof s->name, "%s", name);
    s->t = t;
    return t;
}

sg_status sg_builder_rng(sg_builder *b, uint32_t n_sites, sg_tensor **rng, uint32_t *first_site)
{
    if (!b->rng) SG_TRY(sg_tensor_create(b->ctx, SG_DTYPE_I32, 1, (int64_t[]){4}, "rng", &b->rng));
    *rng = b->rng;
    *first_site = b->sites;
    b->sites += n_sites;
    return SG_OK;
}

/* ---- module set-up shared by every kind ---- */

static bool made_add(sg_builder *b, sg_module *m)
{
    if (b->n_made == b->cap_made) {
        int cap = b->cap_made ? 2 * b->cap_made : 64;
        sg_module **a = realloc(b->made, (size_t)cap * sizeof *a);
        if (!a) return false;
        b->made = a, b->cap_made = cap;
    }
    b->made[b->n_made++] = m;
    return true;
}

static void made_remove(sg_builder *b, sg_module *m)
{
    for (int i = 0; i < b->n_made; i++)
        if (b->made[i] == m) {
            b->made[i] = b->made[--b->n_made];
            return;
        }
}

sg_status sg_module_init(sg_builder *b, sg_module *mod, const sg_module_i *vt, const char *name)
{
    if (!b->ctx) {
        free(mod);
        return SG_ERR_NULL;
    }
    const char *what = vt->kind;
    if (b->finished) {
        free(mod);
        return sg_fail(b->ctx, SG_ERR_INVALID, "sg_module_%s: '%s': the model is already built", what, name);
    }
    const char *n = name && name[0] ? name : "";
    size_t need = strlen(b->scope) + (b->scope[0] && n[0] ? 1 : 0) + strlen(n);
    if (need >= SG_MODULE_NAME_MAX) {
        free(mod);
        return sg_fail(b->ctx, SG_ERR_INVALID, "sg_module_%s: name '%s%s%s' is longer than %d characters", what,
                       b->scope, b->scope[0] && n[0] ? "." : "", n, SG_MODULE_NAME_MAX - 1);
    }
    mod->vt = vt;
    mod->ctx = b->ctx;
    mod->b = b;
    mod->first_param = -1;
    mod->region = b->rc_open;
    snprintf(mod->name, sizeof mod->name, "%s%s%s", b->scope, b->scope[0] && n[0] ? "." : "", n);
    if (!made_add(b, mod)) {
        free(mod);
        return sg_fail(b->ctx, SG_ERR_OOM, "sg_module_%s: out of host memory", what);
    }
    return SG_OK;
}

/* Whether a parameter or buffer of this name is declared in ps. */
static bool set_has(const sg_param_set *ps, const char *name)
{
    for (int i = 0; i < ps->count; i++)
        if (!strcmp(ps->info[i].name, name)) return true;
    return false;
}

int sg_module_declare(sg_module *mod, const char *what, int ndim, const int64_t *shape, sg_init init,
                      int64_t fan_in, int decay)
{
    if (!mod->b) return sg_fail(mod->ctx, SG_ERR_INVALID, "sg_module_param: '%s' has no builder", mod->name), -1;
    char n[SG_PARAM_NAME_MAX + 1];
    int len = snprintf(n, sizeof n, "%s%s%s", mod->name, mod->name[0] ? "." : "", what ? what : "");
    if (!what || !what[0] || len >= SG_PARAM_NAME_MAX) {
        sg_fail(mod->ctx, SG_ERR_INVALID, "sg_module_param: '%s': parameter name '%s': expected 1 character "
                "or more, and at most %d with the module's name", mod->name, what ? what : "(null)",
                SG_PARAM_NAME_MAX - 1);
        return -1;
    }
    if (set_has(&mod->b->bufs, n)) {
        sg_fail(mod->ctx, SG_ERR_INVALID, "sg_module_param: '%s' is already a buffer's name: names must be unique", n);
        return -1;
    }
    int i = sg_params_declare(&mod->b->params, n, ndim, shape, decay, init, fan_in);
    if (i >= 0 && mod->first_param < 0) mod->first_param = i;
    return i;
}

int sg_module_declare_buffer(sg_module *m, const char *name, int ndim, const int64_t *shape, sg_init init)
{
    if (!m) return -1;
    if (!m->b) return sg_fail(m->ctx, SG_ERR_INVALID, "sg_module_declare_buffer: '%s' has no builder", m->name), -1;
    char n[SG_PARAM_NAME_MAX + 1];
    int len = snprintf(n, sizeof n, "%s%s%s", m->name, m->name[0] ? "." : "", name ? name : "");
    if (!name || !name[0] || len >= SG_PARAM_NAME_MAX || (init != SG_INIT_ZEROS && init != SG_INIT_ONES)) {
        sg_fail(m->ctx, SG_ERR_INVALID, "sg_module_declare_buffer: '%s': buffer '%s' with init %d: expected a name "
                "of 1 to %d characters with the module's, and SG_INIT_ZEROS or SG_INIT_ONES", m->name,
                name ? name : "(null)", (int)init, SG_PARAM_NAME_MAX - 1);
        return -1;
    }
    if (set_has(&m->b->params, n)) {
        sg_fail(m->ctx, SG_ERR_INVALID, "sg_module_declare_buffer: '%s' is already a parameter's name: names must "
                "be unique", n);
        return -1;
    }
    return sg_params_declare(&m->b->bufs, n, ndim, shape, 0, init, 0);
}

sg_tensor *sg_module_buffer_tensor(const sg_module *m, int i)
{
    if (!m || !m->b) return NULL;
    const sg_param_set *bs = &m->b->bufs;
    if (i < 0 || i >= bs->count || !bs->flat) {
        sg_fail(m->ctx, SG_ERR_INVALID, "sg_module_buffer_tensor: '%s': buffer %d %s", m->name, i,
                bs->flat ? "is not one of the model's" : "has no tensor before sg_builder_finish");
        return NULL;
    }
    return bs->param[i];
}

int sg_module_training(const sg_module *m) { return m && m->b && !m->b->eval; }
int sg_module_updates_buffers(const sg_module *m) { return sg_module_training(m) && !m->b->recomputing; }

sg_status sg_module_adopt(sg_module *parent, sg_module **children, int n)
{
    for (int i = 0; i < n; i++) {
        sg_module *c = children[i];
        if (!c)
            return sg_fail(parent->ctx, SG_ERR_NULL, "sg_module_%s: '%s': child %d is NULL", parent->vt->kind,
                           parent->name, i);
        if (c->b != parent->b)
            return sg_fail(parent->ctx, SG_ERR_INVALID, "sg_module_%s: '%s': child '%s' was made by another "
                           "builder", parent->vt->kind, parent->name, c->name);
        if (c->owned || c == parent)
            return sg_fail(parent->ctx, SG_ERR_INVALID, "sg_module_%s: '%s': child '%s' already belongs to a "
                           "container or a model", parent->vt->kind, parent->name, c->name);
        for (int j = 0; j < i; j++)
            if (children[j] == c)
                return sg_fail(parent->ctx, SG_ERR_INVALID, "sg_module_%s: '%s': child '%s' is given twice",
                               parent->vt->kind, parent->name, c->name);
    }
    for (int i = 0; i < n; i++) {
        children[i]->owned = true;
        int p = children[i]->first_param;
        if (p >= 0 && (parent->first_param < 0 || p < parent->first_param)) parent->first_param = p;
    }
    return SG_OK;
}

sg_status sg_module_buffer_kept(sg_module *mod, sg_dtype dt, const char *what, int ndim, const int64_t *shape,
                                sg_tensor **out)
{
    char n[SG_MODULE_NAME_MAX + 32];
    snprintf(n, sizeof n, "%s%s%s", mod->name, mod->name[0] ? "." : "", what);
    return sg_tensor_create(mod->ctx, dt, ndim, shape, n, out);
}

/* A module made in a recompute region keeps its buffers in the region's part of the arena. */
sg_status sg_module_buffer(sg_module *mod, sg_dtype dt, const char *what, int ndim, const int64_t *shape,
                           sg_tensor **out)
{
    if (mod->region < 0 || !mod->b) return sg_module_buffer_kept(mod, dt, what, ndim, shape, out);
    char n[SG_MODULE_NAME_MAX + 32];
    snprintf(n, sizeof n, "%s%s%s", mod->name, mod->name[0] ? "." : "", what);
    return sg_recompute_buffer(mod, dt, n, ndim, shape, out);
}

/* Public: only a module nobody owns (a container or a model frees its own). */
void sg_module_destroy(sg_module *m)
{
    if (!m || m->owned) return;
    if (m->b && !m->b->finished) {
        made_remove(m->b, m);
        if (m->region >= 0) m->b->rc_broken = true; /* its buffers were to be placed: the build fails */
    }
    m->vt->destroy(m);
}

sg_ctx *sg_module_ctx(const sg_module *m) { return m ? m->ctx : NULL; }
const char *sg_module_name(const sg_module *m) { return m ? m->name : ""; }
int sg_module_needs_input_grad(const sg_module *m) { return m && !m->no_input_grad; }

int sg_module_param(sg_module *m, const char *name, int ndim, const int64_t *shape, sg_init init,
                    int64_t fan_in, int decay)
{
    if (!m) return -1;
    if (init < SG_INIT_UNIFORM_FAN_IN || init > SG_INIT_NORMAL_002) {
        sg_fail(m->ctx, SG_ERR_INVALID, "sg_module_param: '%s.%s': unknown init %d", m->name, name ? name : "",
                (int)init);
        return -1;
    }
    return sg_module_declare(m, name, ndim, shape, init, fan_in, decay);
}

/* A parameter handle of m's model, checked: the tensors exist once the model is built. */
static bool param_ok(const sg_module *m, int p, const char *fn)
{
    if (!m || !m->b) return false;
    const sg_param_set *ps = &m->b->params;
    if (p < 0 || p >= ps->count || !ps->flat) {
        sg_fail(m->ctx, SG_ERR_INVALID, "%s: '%s': parameter %d %s", fn, m->name, p,
                ps->flat ? "is not one of the model's" : "has no tensor before sg_builder_finish");
        return false;
    }
    return true;
}

sg_tensor *sg_module_param_tensor(const sg_module *m, int p)
{
    return param_ok(m, p, "sg_module_param_tensor") ? sg_module_w(m, p) : NULL;
}

sg_tensor *sg_module_param_grad(const sg_module *m, int p)
{
    return param_ok(m, p, "sg_module_param_grad") ? sg_module_g(m, p) : NULL;
}

/* ---- a user's module: its public ops behind the internal table ---- */

typedef struct user_module {
    sg_module base;
    const sg_module_ops *ops;
    void *state;
} user_module;

static sg_status user_forward(sg_module *m, const sg_tensor *x, const sg_tensor **y)
{
    user_module *u = (user_module *)m;
    *y = NULL;
    SG_TRY(u->ops->forward(m, x, y));
    if (!*y)
        return sg_fail(m->ctx, SG_ERR_INVALID, "sg_module_forward: '%s' (%s) returned no output", m->name,
                       u->ops->kind ? u->ops->kind : "user module");
    return SG_OK;
}

static sg_status user_backward(sg_module *m, sg_tensor *dy, sg_tensor **dx)
{
    user_module *u = (user_module *)m;
    *dx = NULL;
    return u->ops->backward(m, dy, dx);
}

static sg_status user_set_rows(sg_module *m, int64_t rows)
{
    user_module *u = (user_module *)m;
    if (!u->ops->set_rows && rows == m->b->rows) return SG_OK; /* the rows it was made for */
    if (!u->ops->set_rows)
        return sg_fail(m->ctx, SG_ERR_UNSUPPORTED, "'%s' (%s) has no set_rows: variable batch or sequence "
                       "lengths need it", m->name, u->ops->kind ? u->ops->kind : "user module");
    return u->ops->set_rows(m, rows);
}

static void user_destroy(sg_module *m)
{
    user_module *u = (user_module *)m;
    if (u->ops->destroy) u->ops->destroy(m);
    free(u);
}

static const sg_module_i user_i = {"create", user_forward, user_backward, user_destroy, user_set_rows, NULL};

sg_status sg_module_create(sg_builder *b, const char *name, const sg_module_ops *ops, void *state,
                           sg_module **out)
{
    if (!b) return SG_ERR_NULL;
    if (!out || !ops || !ops->forward || !ops->backward)
        return sg_fail(b->ctx, SG_ERR_NULL, "sg_module_create: '%s': out, ops, ops->forward and ops->backward "
                       "are required", name ? name : "(null)");
    *out = NULL;
    user_module *u = calloc(1, sizeof *u);
    if (!u) return sg_fail(b->ctx, SG_ERR_OOM, "sg_module_create: out of host memory");
    SG_TRY(sg_module_init(b, &u->base, &user_i, name));
    u->ops = ops;
    u->state = state;
    *out = &u->base;
    return SG_OK;
}

void *sg_module_state(const sg_module *m)
{
    return m && m->vt == &user_i ? ((const user_module *)m)->state : NULL;
}
