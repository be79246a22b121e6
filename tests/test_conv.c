/* test_conv.c: the 2-D convolution (channels last), forward and backward. `cpu`: the reference
 * against a naive formula and float64 finite differences of dx, dw and db on small random
 * shapes (stride 2, padding, dilation, groups, depthwise, 1x1 and 7x7 kernels, asymmetric
 * everything, odd sizes, channel counts that are not multiples of 8); its f32 and bf16 paths
 * against f64 on the same values; argument refusals (the context usable afterwards); a
 * captured plan that replays it. `gpu`: cuDNN against the CPU reference in f32 and bf16 on
 * the same variety plus ResNet- and EfficientNet-sized layers, outputs poisoned first; bitwise
 * determinism; dx and db left out; y without b; a captured graph that reproduces eager bit for
 * bit and allocates nothing. Then stepgraph's depthwise kernels (dwconv_cuda.cu), forced with
 * STEPGRAPH_DEPTHWISE=own, on the same checks over odd depthwise shapes (kernels 1, 3, 5, 7,
 * strides 1 to 3, padding, dilation 2, C 3, 13, 40, 96 and EfficientNet's, odd H W); their
 * vector and scalar paths the same bits; the variable's modes, remembered per mode; and
 * auto. */
#include "ops/conv.h"
#include "testutil.h"

/* ---- shapes ---- */

typedef struct cshape {
    int64_t N, H, W, Cin, Cout, KH, KW;
    sg_conv2d_params p;
} cshape;

static void x_shape(const cshape *s, int64_t o[4])
{
    o[0] = s->N, o[1] = s->H, o[2] = s->W, o[3] = s->Cin;
}

static void w_shape(const cshape *s, int64_t o[4])
{
    o[0] = s->Cout, o[1] = s->KH, o[2] = s->KW, o[3] = s->Cin / s->p.groups;
}

/* The documented output size, written out here. */
static int64_t out_dim(int64_t in, int64_t k, int stride, int pad, int dil)
{
    return (in + 2 * pad - dil * (k - 1) - 1) / stride + 1;
}

static void y_shape(const cshape *s, int64_t o[4])
{
    o[0] = s->N;
    o[1] = out_dim(s->H, s->KH, s->p.stride_h, s->p.pad_h, s->p.dil_h);
    o[2] = out_dim(s->W, s->KW, s->p.stride_w, s->p.pad_w, s->p.dil_w);
    o[3] = s->Cout;
}

/* snprintf for labels: they may be cut short, never overflow (and, through a va_list, raise no
 * truncation warnings for long descriptions). */
static void label(char *buf, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, n, fmt, ap);
    va_end(ap);
}

static const char *describe(const cshape *s, sg_dtype dt, char *buf, size_t n)
{
    label(buf, n,
          "conv %s x (%lld,%lld,%lld,%lld) w (%lld,%lld,%lld,%lld) s%dx%d p%dx%d d%dx%d g%d",
             sg_dtype_name(dt), (long long)s->N, (long long)s->H, (long long)s->W,
             (long long)s->Cin, (long long)s->Cout, (long long)s->KH, (long long)s->KW,
             (long long)(s->Cin / s->p.groups), s->p.stride_h, s->p.stride_w, s->p.pad_h,
             s->p.pad_w, s->p.dil_h, s->p.dil_w, s->p.groups);
    return buf;
}

static sg_conv2d_params params(int sh, int sw, int ph, int pw, int dh, int dw, int g)
{
    sg_conv2d_params p = {.stride_h = sh, .stride_w = sw, .pad_h = ph, .pad_w = pw,
                          .dil_h = dh, .dil_w = dw, .groups = g};
    return p;
}

/* A channel count in [1, 13] other than 8. */
static int64_t odd_channels(void)
{
    int c = tu_randint(1, 12);
    return c >= 8 ? c + 1 : c;
}

/* Small random shapes of each kind the op must get right. */
enum { K_STRIDE2, K_DILATED, K_GROUPED, K_DEPTHWISE, K_1X1, K_7X7, K_ANY, K_COUNT };
static const char *const kind_names[K_COUNT] = {"stride 2 + padding", "dilated", "grouped",
                                                "depthwise", "1x1", "7x7 stem", "asymmetric"};

static cshape random_case(int kind)
{
    cshape s = {.N = tu_randint(1, 2), .H = tu_randint(5, 9), .W = tu_randint(5, 9),
                .Cin = odd_channels(), .Cout = odd_channels(), .KH = 3, .KW = 3};
    s.p = params(1, 1, 1, 1, 1, 1, 1);
    switch (kind) {
    case K_STRIDE2: s.p = params(2, 2, 1, 1, 1, 1, 1); break;
    case K_DILATED:
        s.H = 2 * tu_randint(3, 5) + 1, s.W = 2 * tu_randint(3, 5) + 1;
        s.KW = 2;
        s.p = params(1, 1, 2, tu_randint(0, 2), 2, 3, 1);
        break;
    case K_GROUPED: {
        int g = tu_randint(2, 3);
        s.Cin = g * tu_randint(1, 3), s.Cout = g * tu_randint(1, 3);
        s.p.groups = g;
        break;
    }
    case K_DEPTHWISE:
        s.Cin = s.Cout = tu_randint(2, 11);
        s.p = params(tu_randint(1, 2), tu_randint(1, 2), 1, 1, 1, 1, (int)s.Cin);
        break;
    case K_1X1:
        s.KH = s.KW = 1;
        s.p = params(tu_randint(1, 2), tu_randint(1, 2), 0, 0, 1, 1, 1);
        break;
    case K_7X7:
        s.H = tu_randint(8, 13), s.W = tu_randint(8, 13), s.Cin = 3, s.Cout = tu_randint(2, 6);
        s.KH = s.KW = 7;
        s.p = params(2, 2, 3, 3, 1, 1, 1);
        break;
    default: { /* everything drawn independently, output kept non-empty */
        int g = tu_randint(1, 2);
        s.Cin = g * tu_randint(1, 4), s.Cout = g * tu_randint(1, 4);
        s.KH = tu_randint(1, 4), s.KW = tu_randint(1, 4);
        s.p = params(tu_randint(1, 3), tu_randint(1, 3), tu_randint(0, 2), tu_randint(0, 2),
                     tu_randint(1, 2), tu_randint(1, 2), g);
        int64_t h0 = s.p.dil_h * (s.KH - 1) + 1 - 2 * s.p.pad_h; /* smallest H with an output */
        int64_t w0 = s.p.dil_w * (s.KW - 1) + 1 - 2 * s.p.pad_w;
        s.H = (h0 > 1 ? h0 : 1) + tu_randint(0, 5), s.W = (w0 > 1 ? w0 : 1) + tu_randint(0, 5);
        break;
    }
    }
    return s;
}

/* ---- helpers ---- */

static sg_conv2d *plan(sg_ctx *ctx, const cshape *s, sg_dtype dt)
{
    int64_t xs[4], ws[4];
    x_shape(s, xs), w_shape(s, ws);
    sg_conv2d *c = NULL;
    TU_OK(ctx, sg_conv2d_create(ctx, xs, ws, &s->p, dt, &c));
    return c;
}

static double *random_vals(int64_t n)
{
    double *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = tu_uniform(-1, 1);
    return v;
}

static double *abs_vals(const double *v, int64_t n)
{
    double *a = malloc((size_t)n * sizeof *a);
    for (int64_t i = 0; i < n; i++) a[i] = fabs(v[i]);
    return a;
}

/* One case's tensors on one context, in one dtype. */
typedef struct ctensors {
    sg_tensor *x, *w, *b, *y, *dy, *dx, *dw, *db;
} ctensors;

static ctensors make_tensors(sg_ctx *ctx, const cshape *s, sg_dtype dt)
{
    int64_t xs[4], ws[4], ys[4];
    x_shape(s, xs), w_shape(s, ws), y_shape(s, ys);
    ctensors t = {.x = tu_tensor(ctx, dt, 4, xs, "x"), .w = tu_tensor(ctx, dt, 4, ws, "w"),
                  .b = tu_tensor1(ctx, dt, s->Cout, "b"), .y = tu_tensor(ctx, dt, 4, ys, "y"),
                  .dy = tu_tensor(ctx, dt, 4, ys, "dy"), .dx = tu_tensor(ctx, dt, 4, xs, "dx"),
                  .dw = tu_tensor(ctx, dt, 4, ws, "dw"), .db = tu_tensor1(ctx, dt, s->Cout, "db")};
    return t;
}

static void free_tensors(ctensors *t)
{
    sg_tensor *ts[] = {t->x, t->w, t->b, t->y, t->dy, t->dx, t->dw, t->db};
    tu_destroy_all(ts, sizeof ts / sizeof *ts);
}

static void poison_outputs(ctensors *t)
{
    tu_poison(t->y), tu_poison(t->dx), tu_poison(t->dw), tu_poison(t->db);
}

/* The definition, written out independently of the reference's loop order: for each output
 * element, its group's input channels and every tap, reading 0 in the padding. */
static void naive_forward(const cshape *s, const double *x, const double *w, const double *b,
                          double *y)
{
    int64_t ys[4];
    y_shape(s, ys);
    const int64_t Cg = s->Cin / s->p.groups, Cog = s->Cout / s->p.groups;
    for (int64_t n = 0; n < s->N; n++)
        for (int64_t co = 0; co < s->Cout; co++)
            for (int64_t oh = 0; oh < ys[1]; oh++)
                for (int64_t ow = 0; ow < ys[2]; ow++) {
                    double acc = b ? b[co] : 0;
                    for (int64_t ci = 0; ci < Cg; ci++)
                        for (int64_t kh = 0; kh < s->KH; kh++)
                            for (int64_t kw = 0; kw < s->KW; kw++) {
                                int64_t ih = oh * s->p.stride_h + kh * s->p.dil_h - s->p.pad_h;
                                int64_t iw = ow * s->p.stride_w + kw * s->p.dil_w - s->p.pad_w;
                                if (ih < 0 || ih >= s->H || iw < 0 || iw >= s->W) continue;
                                int64_t c = (co / Cog) * Cg + ci;
                                acc += x[((n * s->H + ih) * s->W + iw) * s->Cin + c] *
                                       w[((co * s->KH + kh) * s->KW + kw) * Cg + ci];
                            }
                    y[((n * ys[1] + oh) * ys[2] + ow) * s->Cout + co] = acc;
                }
}

/* ---- cpu: formula, finite differences ---- */

typedef struct fd_case {
    sg_ctx *ctx;
    sg_conv2d *c;
    ctensors *t;
} fd_case;

/* L = sum(y * dy): dL/dy = dy, so the backward with that dy gives dL/dx, dL/dw, dL/db. */
static double fd_loss(void *u)
{
    fd_case *f = u;
    TU_OK(f->ctx, sg_conv2d_forward(f->ctx, f->c, f->t->x, f->t->w, f->t->b, f->t->y));
    return tu_dot(f->t->y, f->t->dy);
}

static void cpu_gradcheck(sg_ctx *ctx, const cshape *s, const char *kind)
{
    char what[128], w[112]; /* w: tu_gradcheck's labels hold 160 */
    describe(s, SG_DTYPE_F64, what, sizeof what);
    sg_conv2d *c = plan(ctx, s, SG_DTYPE_F64);
    int64_t ys[4], got[4];
    y_shape(s, ys);
    sg_conv2d_out_shape(c, got);
    TU_CHECK(!memcmp(ys, got, sizeof ys), "%s (%s): out_shape (%lld,%lld,%lld,%lld)", what, kind,
             (long long)got[0], (long long)got[1], (long long)got[2], (long long)got[3]);
    TU_CHECK(sg_conv2d_workspace_bytes(c) == 0, "%s: a CPU plan holds %zu workspace bytes", what,
             sg_conv2d_workspace_bytes(c));

    ctensors t = make_tensors(ctx, s, SG_DTYPE_F64);
    double *xv = tu_random(t.x, -1, 1), *wv = tu_random(t.w, -1, 1), *bv = tu_random(t.b, -1, 1);
    free(tu_random(t.dy, -1, 1));

    /* Forward against the formula. */
    poison_outputs(&t);
    TU_OK(ctx, sg_conv2d_forward(ctx, c, t.x, t.w, t.b, t.y));
    double *ye = malloc((size_t)t.y->numel * sizeof *ye);
    naive_forward(s, xv, wv, bv, ye);
    label(w, sizeof w, "%s (%s): y vs formula", what, kind);
    tu_close_vals(w, t.y, ye, t.y->numel, tu_tol_for(SG_DTYPE_F64));

    /* Without b: y - b. */
    sg_tensor *y0 = tu_tensor(ctx, SG_DTYPE_F64, 4, ys, "y0");
    tu_poison(y0);
    TU_OK(ctx, sg_conv2d_forward(ctx, c, t.x, t.w, NULL, y0));
    naive_forward(s, xv, wv, NULL, ye);
    label(w, sizeof w, "%s (%s): y without bias vs formula", what, kind);
    tu_close_vals(w, y0, ye, y0->numel, tu_tol_for(SG_DTYPE_F64));

    /* Backward, then central differences of L through the forward alone. L is linear in each
     * input, so the differences have no truncation error: only rounding, ~1e-16 |L| / h, far
     * under 1e-9 with h = 1e-3 and |L| of tens at most. */
    TU_OK(ctx, sg_conv2d_backward(ctx, c, t.x, t.w, t.dy, t.dx, t.dw, t.db));
    fd_case f = {ctx, c, &t};
    tu_tol tol = {1e-9, 1e-7};
    label(w, sizeof w, "%s (%s): dx", what, kind);
    tu_gradcheck(w, fd_loss, &f, t.x, t.dx, 48, 1e-3, tol);
    label(w, sizeof w, "%s (%s): dw", what, kind);
    tu_gradcheck(w, fd_loss, &f, t.w, t.dw, 48, 1e-3, tol);
    label(w, sizeof w, "%s (%s): db", what, kind);
    tu_gradcheck(w, fd_loss, &f, t.b, t.db, 0, 1e-3, tol);

    /* dx and db left out: dw the same bits (outputs are written, never accumulated). */
    void *dw_bits = tu_raw(t.dw);
    tu_poison(t.dw);
    TU_OK(ctx, sg_conv2d_backward(ctx, c, t.x, t.w, t.dy, NULL, t.dw, NULL));
    TU_CHECK(tu_same_bytes(t.dw, dw_bits), "%s (%s): dw differs when dx and db are left out", what,
             kind);
    free(dw_bits);

    free(xv), free(wv), free(bv), free(ye);
    sg_tensor_destroy(y0);
    free_tensors(&t);
    sg_conv2d_destroy(c);
}

/* f32 and bf16 on the CPU (the GPU test's oracle): the same values in f64 give the exact
 * results, which the dtype's outputs must equal rounded once (half an ulp: 2^-24 relative in
 * f32, 2^-9 in bf16; the rule below allows a whole ulp). */
static void cpu_dtypes(sg_ctx *ctx)
{
    const sg_dtype dts[2] = {SG_DTYPE_F32, SG_DTYPE_BF16};
    for (int d = 0; d < 2; d++) {
        sg_dtype dt = dts[d];
        cshape s = random_case(tu_randint(0, K_COUNT - 1));
        char what[256], w[320];
        describe(&s, dt, what, sizeof what);
        sg_conv2d *c = plan(ctx, &s, dt), *c64 = plan(ctx, &s, SG_DTYPE_F64);
        ctensors t = make_tensors(ctx, &s, dt), e = make_tensors(ctx, &s, SG_DTYPE_F64);
        sg_tensor *in[4] = {t.x, t.w, t.b, t.dy}, *in64[4] = {e.x, e.w, e.b, e.dy};
        for (int i = 0; i < 4; i++) {
            free(tu_random(in[i], -1, 1));
            double *v = tu_get(in[i]); /* as stored in dt */
            tu_set(in64[i], v);
            free(v);
        }
        poison_outputs(&t);
        TU_OK(ctx, sg_conv2d_forward(ctx, c, t.x, t.w, t.b, t.y));
        TU_OK(ctx, sg_conv2d_backward(ctx, c, t.x, t.w, t.dy, t.dx, t.dw, t.db));
        TU_OK(ctx, sg_conv2d_forward(ctx, c64, e.x, e.w, e.b, e.y));
        TU_OK(ctx, sg_conv2d_backward(ctx, c64, e.x, e.w, e.dy, e.dx, e.dw, e.db));
        tu_tol tol = {0, dt == SG_DTYPE_F32 ? 0x1p-23 : 0x1p-8};
        const sg_tensor *got[4] = {t.y, t.dx, t.dw, t.db}, *ref[4] = {e.y, e.dx, e.dw, e.db};
        for (int i = 0; i < 4; i++) {
            label(w, sizeof w, "%s: %s vs f64", what, got[i]->name);
            tu_close_tensors(w, got[i], ref[i], tol);
        }
        free_tensors(&t), free_tensors(&e);
        sg_conv2d_destroy(c), sg_conv2d_destroy(c64);
    }
}

/* ---- argument refusals ---- */

static void cpu_errors(sg_ctx *ctx)
{
    const sg_dtype f64 = SG_DTYPE_F64;
    sg_conv2d *c = NULL;
    sg_conv2d_params p = params(1, 1, 1, 1, 1, 1, 2);
    int64_t xs[4] = {2, 6, 5, 4}, ws[4] = {6, 3, 3, 2}, ys[4] = {2, 6, 5, 6};

    /* The plan. */
    int64_t w_bad[4] = {6, 3, 3, 4}, x_odd[4] = {2, 6, 5, 6}, w4[4] = {4, 3, 3, 1};
    sg_conv2d_params g4 = params(1, 1, 1, 1, 1, 1, 4), s0 = params(0, 1, 1, 1, 1, 1, 1);
    TU_FAILS(ctx, sg_conv2d_create(ctx, x_odd, w4, &g4, f64, &c), SG_ERR_SHAPE,
             "groups 4 must divide Cin 6");
    TU_CHECK(c == NULL, "a failed create left a plan");
    TU_FAILS(ctx, sg_conv2d_create(ctx, xs, w_bad, &p, f64, &c), SG_ERR_SHAPE,
             "w's last dim must be Cin / groups = 2");
    TU_FAILS(ctx, sg_conv2d_create(ctx, xs, ws, &s0, f64, &c), SG_ERR_INVALID, "stride 0x1");
    int64_t x_small[4] = {1, 3, 3, 2}, w_big[4] = {2, 5, 5, 2}, x_zero[4] = {0, 3, 3, 2};
    sg_conv2d_params p0 = params(1, 1, 0, 0, 1, 1, 1);
    TU_FAILS(ctx, sg_conv2d_create(ctx, x_small, w_big, &p0, f64, &c), SG_ERR_SHAPE,
             "spans more than x's padded 3x3 image");
    TU_FAILS(ctx, sg_conv2d_create(ctx, x_zero, w_big, &p0, f64, &c), SG_ERR_SHAPE,
             "every dimension must be >= 1");
    TU_FAILS(ctx, sg_conv2d_create(ctx, xs, ws, &p, SG_DTYPE_I32, &c), SG_ERR_DTYPE,
             "dtype i32, expected f32 or bf16 or f64");
    TU_FAILS(ctx, sg_conv2d_create(ctx, xs, ws, NULL, f64, &c), SG_ERR_NULL, "params is NULL");
    TU_FAILS(ctx, sg_conv2d_create(ctx, xs, ws, &p, f64, NULL), SG_ERR_NULL, "out is NULL");

    TU_OK(ctx, sg_conv2d_create(ctx, xs, ws, &p, f64, &c));
    sg_tensor *x = tu_tensor(ctx, f64, 4, xs, "x"), *w = tu_tensor(ctx, f64, 4, ws, "w");
    sg_tensor *b = tu_tensor1(ctx, f64, 6, "b"), *y = tu_tensor(ctx, f64, 4, ys, "y");
    sg_tensor *dy = tu_tensor(ctx, f64, 4, ys, "dy"), *dx = tu_tensor(ctx, f64, 4, xs, "dx");
    sg_tensor *dw = tu_tensor(ctx, f64, 4, ws, "dw"), *db = tu_tensor1(ctx, f64, 6, "db");
    int64_t x_wide[4] = {2, 6, 6, 4};
    sg_tensor *xw = tu_tensor(ctx, f64, 4, x_wide, "x_wide");
    sg_tensor *x32 = tu_tensor(ctx, SG_DTYPE_F32, 4, xs, "x32");
    sg_tensor *b5 = tu_tensor1(ctx, f64, 5, "b5");
    double *xv = tu_random(x, -1, 1), *wv = tu_random(w, -1, 1), *bv = tu_random(b, -1, 1);
    free(tu_random(dy, -1, 1));
    free(tu_random(xw, -1, 1));
    free(tu_random(x32, -1, 1));

    /* The forward. */
    TU_FAILS(ctx, sg_conv2d_forward(ctx, c, xw, w, b, y), SG_ERR_SHAPE,
             "sg_conv2d_forward: 'x' is (2, 6, 6, 4) f64, expected (2, 6, 5, 4) f64 (the plan's)");
    TU_FAILS(ctx, sg_conv2d_forward(ctx, c, x32, w, b, y), SG_ERR_DTYPE,
             "'x' is (2, 6, 5, 4) f32, expected (2, 6, 5, 4) f64");
    TU_FAILS(ctx, sg_conv2d_forward(ctx, c, x, w, b5, y), SG_ERR_SHAPE,
             "'b' is (5) f64, expected (6) f64");
    TU_FAILS(ctx, sg_conv2d_forward(ctx, c, x, w, b, dx), SG_ERR_SHAPE,
             "'y' is (2, 6, 5, 4) f64, expected (2, 6, 5, 6) f64");
    TU_FAILS(ctx, sg_conv2d_forward(ctx, c, x, NULL, b, y), SG_ERR_NULL, "tensor 'w' is NULL");
    TU_FAILS(ctx, sg_conv2d_forward(ctx, NULL, x, w, b, y), SG_ERR_NULL,
             "the plan is NULL");
    /* A plan made for other shapes (x 6 wide): the tensors do not match it. */
    sg_conv2d *other_plan = NULL;
    TU_OK(ctx, sg_conv2d_create(ctx, x_wide, ws, &p, f64, &other_plan));
    TU_FAILS(ctx, sg_conv2d_forward(ctx, other_plan, x, w, b, y), SG_ERR_SHAPE,
             "'x' is (2, 6, 5, 4) f64, expected (2, 6, 6, 4) f64 (the plan's)");
    /* A plan of another context. */
    sg_ctx *other = tu_ctx(SG_BACKEND_CPU);
    sg_conv2d *foreign = NULL;
    TU_OK(other, sg_conv2d_create(other, xs, ws, &p, f64, &foreign));
    TU_FAILS(ctx, sg_conv2d_forward(ctx, foreign, x, w, b, y), SG_ERR_BACKEND,
             "the plan belongs to another context");
    /* Outputs that overlap an input: a 1x1 plan whose y has x's shape. */
    int64_t w11[4] = {4, 1, 1, 4};
    sg_conv2d_params p1 = params(1, 1, 0, 0, 1, 1, 1);
    sg_conv2d *c1 = NULL;
    TU_OK(ctx, sg_conv2d_create(ctx, xs, w11, &p1, f64, &c1));
    sg_tensor *w1 = tu_tensor(ctx, f64, 4, w11, "w1"), *dw1 = tu_tensor(ctx, f64, 4, w11, "dw1");
    free(tu_random(w1, -1, 1));
    TU_FAILS(ctx, sg_conv2d_forward(ctx, c1, x, w1, NULL, x), SG_ERR_INVALID,
             "output 'y' overlaps 'x'");

    /* The backward. */
    TU_FAILS(ctx, sg_conv2d_backward(ctx, c, x, w, dy, dx, NULL, db), SG_ERR_NULL,
             "sg_conv2d_backward: tensor 'dw' is NULL");
    TU_FAILS(ctx, sg_conv2d_backward(ctx, c, x, w, x, dx, dw, db), SG_ERR_SHAPE,
             "'dy' is (2, 6, 5, 4) f64, expected (2, 6, 5, 6) f64");
    TU_FAILS(ctx, sg_conv2d_backward(ctx, c, x, w, dy, x32, dw, db), SG_ERR_DTYPE, "'dx' is");
    TU_FAILS(ctx, sg_conv2d_backward(ctx, c, x, w, dy, dx, dw, b5), SG_ERR_SHAPE,
             "'db' is (5) f64, expected (6) f64");
    TU_FAILS(ctx, sg_conv2d_backward(ctx, c1, x, w1, dx, dx, dw1, NULL), SG_ERR_INVALID,
             "output 'dx' overlaps 'dy'");
    TU_FAILS(ctx, sg_conv2d_backward(ctx, c, x, w, dy, dx, w, db), SG_ERR_INVALID,
             "output 'dw' overlaps 'w'");

    /* A failed call writes nothing. */
    TU_OK(ctx, sg_tensor_fill(y, 12345.0));
    TU_FAILS(ctx, sg_conv2d_forward(ctx, c, x, w, b5, y), SG_ERR_SHAPE, "'b'");
    TU_CHECK(sg_ld(y, 0) == 12345.0 && sg_ld(y, y->numel - 1) == 12345.0, "a failed call wrote y");

    /* The context is still usable, and computes the right thing. */
    cshape s = {.N = 2, .H = 6, .W = 5, .Cin = 4, .Cout = 6, .KH = 3, .KW = 3, .p = p};
    tu_poison(y);
    TU_OK(ctx, sg_conv2d_forward(ctx, c, x, w, b, y));
    double *ye = malloc((size_t)y->numel * sizeof *ye);
    naive_forward(&s, xv, wv, bv, ye);
    tu_close_vals("conv after errors: y", y, ye, y->numel, tu_tol_for(f64));
    tu_poison(dw);
    TU_OK(ctx, sg_conv2d_backward(ctx, c, x, w, dy, dx, dw, db));
    TU_CHECK(isfinite(sg_ld(dw, 0)), "conv after errors: dw %g", sg_ld(dw, 0));

    free(xv), free(wv), free(bv), free(ye);
    sg_tensor *ts[] = {x, w, b, y, dy, dx, dw, db, xw, x32, b5, w1, dw1};
    tu_destroy_all(ts, sizeof ts / sizeof *ts);
    sg_conv2d_destroy(c), sg_conv2d_destroy(c1), sg_conv2d_destroy(other_plan);
    sg_conv2d_destroy(foreign);
    sg_ctx_destroy(other);
}

/* ---- capture: forward + backward recorded (CUDA graph, or CPU plan) replay eager's bits ---- */

typedef struct conv_step {
    sg_ctx *ctx;
    sg_conv2d *c;
    const sg_tensor *x, *w, *b, *dy;
    sg_tensor *y, *dx, *dw, *db;
} conv_step;

static sg_status conv_step_fn(void *u)
{
    conv_step *s = u;
    SG_TRY(sg_conv2d_forward(s->ctx, s->c, s->x, s->w, s->b, s->y));
    return sg_conv2d_backward(s->ctx, s->c, s->x, s->w, s->dy, s->dx, s->dw, s->db);
}

/* Two sets of outputs (eager, graph), one plan, compared bit for bit for two input fills; the
 * graph's pool takes no block (nothing allocates during warm-up or capture) and replays leave
 * the context's allocation statistics as they were. */
static void capture_case(sg_ctx *ctx, const cshape *s, sg_dtype dt)
{
    char what[256];
    describe(s, dt, what, sizeof what);
    sg_conv2d *c = plan(ctx, s, dt);
    ctensors e = make_tensors(ctx, s, dt), r = make_tensors(ctx, s, dt);
    free(tu_random(e.x, -1, 1)), free(tu_random(e.w, -1, 1));
    free(tu_random(e.b, -1, 1)), free(tu_random(e.dy, -1, 1));
    conv_step se = {ctx, c, e.x, e.w, e.b, e.dy, e.y, e.dx, e.dw, e.db};
    conv_step sr = {ctx, c, e.x, e.w, e.b, e.dy, r.y, r.dx, r.dw, r.db};

    const sg_tensor *ins[2] = {e.x, e.dy};
    sg_graph_options o = sg_graph_options_default();
    o.name = "conv";
    o.warmup = 1;
    o.static_inputs = ins;
    o.n_static_inputs = 2;
    sg_graph *g = NULL;
    TU_OK(ctx, sg_graph_capture(ctx, conv_step_fn, &sr, &o, &g));
    sg_alloc_stats ps;
    TU_OK(ctx, sg_pool_stats(ctx, sg_graph_pool(g), &ps));
    TU_CHECK(ps.device_allocs == 0 && ps.live_blocks == 0,
             "%s: the capture allocated (%llu device allocations, %llu live blocks in the graph's "
             "pool)",
             what, (unsigned long long)ps.device_allocs, (unsigned long long)ps.live_blocks);
    for (int round = 0; round < 2; round++) {
        if (round) { /* new inputs, refilled in place */
            free(tu_random(e.x, -1, 1));
            free(tu_random(e.dy, -1, 1));
        }
        poison_outputs(&e), poison_outputs(&r);
        TU_OK(ctx, conv_step_fn(&se));
        sg_alloc_stats a0, a1;
        TU_OK(ctx, sg_ctx_alloc_stats(ctx, &a0));
        TU_OK(ctx, sg_graph_replay(g));
        TU_OK(ctx, sg_ctx_sync(ctx));
        TU_OK(ctx, sg_ctx_alloc_stats(ctx, &a1));
        TU_CHECK(a0.device_allocs == a1.device_allocs && a0.cache_hits == a1.cache_hits &&
                     a0.bytes_in_use == a1.bytes_in_use,
                 "%s: a replay allocated", what);
        const sg_tensor *ge[4] = {e.y, e.dx, e.dw, e.db}, *gr[4] = {r.y, r.dx, r.dw, r.db};
        for (int i = 0; i < 4; i++) {
            char w[320];
            label(w, sizeof w, "%s replay %d: %s vs eager", what, round, ge[i]->name);
            tu_close_tensors(w, gr[i], ge[i], (tu_tol){0, 0});
        }
    }
    sg_graph_destroy(g);
    free_tensors(&e), free_tensors(&r);
    sg_conv2d_destroy(c);
}

static void cpu_tests(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    for (int k = 0; k < K_COUNT; k++) {
        cshape s = random_case(k);
        cpu_gradcheck(ctx, &s, kind_names[k]);
    }
    cpu_dtypes(ctx);
    cpu_errors(ctx);
    cshape s = random_case(K_GROUPED);
    capture_case(ctx, &s, SG_DTYPE_F64);
    s = random_case(K_ANY);
    capture_case(ctx, &s, SG_DTYPE_BF16);
    sg_ctx_destroy(ctx);
}

/* ---- gpu: cuDNN and stepgraph's depthwise kernels against the CPU reference ---- */

/* Compares got with ref element by element, each under
 *     |got - ref| <= rtol |ref| + mtol mag,
 * where mag is the same output computed from |x|, |w|, |dy| (and |b|): the sum of the absolute
 * values of the terms, which bounds what reordering a sum can change (a sum that cancels has
 * |ref| << mag). K: the number of terms each output sums.
 *   f32 (cuDNN in CUDNN_FMA_MATH, no TF32): each side rounds once to f32 (rtol 2^-23: one ulp
 *     between them), and cuDNN's f32 accumulation in another order (or through an implicit-GEMM
 *     split of K) errs by at most ~K u mag, typically ~sqrt(K) u mag, u = 2^-24; mtol =
 *     64 sqrt(K) u = 2^-18 sqrt(K) leaves room for transform-based algorithms while staying far
 *     below one missing or misplaced term (mag / K) for every forward and dx reduction tested.
 *   bf16 (same bf16 inputs on both sides, cuDNN's tensor-core products exact in f32, f32
 *     accumulation): both round the result to bf16 (one ulp, 2^-8, apart), and y rounds twice
 *     on the GPU: the convolution's output c is stored in bf16 before + b, an error up to
 *     u |c| <= 2^-8 mag (u = 2^-8, bf16's unit roundoff), which a cancelling bias leaves whole
 *     (seen on the H100: 1.3e-3 mag on a 1x1 conv with bias). So rtol = 2 ulps = 2^-7 and
 *     mtol = 2^-8 (that intermediate rounding, which also covers sums an algorithm keeps in
 *     bf16) + the f32 term above.
 *   once: the output comes from stepgraph's depthwise kernels, which accumulate in f32 and round
 *     once (bias included), so bf16 drops the 2^-8 intermediate-rounding term (rtol stays 2
 *     ulps, the f32 term stays). That term bounds their sums rigorously: y and dx add at most
 *     KH KW <= 49 taps in f32 (error <= K u mag <= 64 sqrt(K) u mag for K <= 4096); dw adds
 *     runs of R rows in f32 and the runs in double, error <= R u mag, within 64 sqrt(K) u mag
 *     while R <= 64 sqrt(K) (R is 32 to a few hundred rows). */
static void close_mag(const char *what, const sg_tensor *got, const sg_tensor *ref,
                      const double *mag, int64_t K, sg_dtype dt, bool once)
{
    const double rtol = dt == SG_DTYPE_F32 ? 0x1p-23 : 0x1p-7;
    const double mtol = (dt == SG_DTYPE_F32 || once ? 0 : 0x1p-8) + 0x1p-18 * sqrt((double)K);
    double *g = tu_get(got), *r = tu_get(ref);
    int64_t bad = 0, worst = 0;
    double worst_excess = -INFINITY;
    for (int64_t i = 0; i < got->numel; i++) {
        double err = fabs(g[i] - r[i]), lim = rtol * fabs(r[i]) + mtol * mag[i];
        double excess = isnan(err) ? INFINITY : err - lim;
        if (excess > 0) bad++;
        if (excess > worst_excess) worst_excess = excess, worst = i;
    }
    if (bad) {
        tu_failures++;
        fprintf(stderr,
                "FAIL %s: %lld of %lld elements outside rtol %.1e + %.1e mag (K %lld); "
                "worst [%lld] got %.9g ref %.9g mag %.6g: error %.3g, limit %.3g\n",
                what, (long long)bad, (long long)got->numel, rtol, mtol, (long long)K,
                (long long)worst, g[worst], r[worst], mag[worst], fabs(g[worst] - r[worst]),
                rtol * fabs(r[worst]) + mtol * mag[worst]);
    }
    free(g), free(r);
}

/* One shape: fresh values, their magnitudes (f64 on the CPU from |values|), then in f32 and in
 * bf16: the CPU reference and the GPU (cuDNN, or stepgraph's depthwise kernels where the plan
 * says so) from the same values (rounded into the dtype), outputs poisoned first; then the same
 * bits again and the documented launches (forward: convolution + bias, ours 1 with the bias
 * fused; backward: data, filter (ours 2: partials, their sum), two bias-gradient kernels); then
 * dx and db left out, dw the same bits; then y without b. want_own: the SG_CONV_OWN_* passes the
 * GPU plan must run on our kernels, or -1 (auto: any). */
static void gpu_case(sg_ctx *gpu, sg_ctx *cpu, const cshape *s, const char *kind, int want_own)
{
    if (tu_racecheck() && want_own != SG_CONV_OWN_ALL) return; /* cuDNN's and cuBLASLt's: see tu_racecheck */
    int64_t xs[4], ws[4], ys[4];
    x_shape(s, xs), w_shape(s, ws), y_shape(s, ys);
    const int64_t nx = xs[0] * xs[1] * xs[2] * xs[3], nw = ws[0] * ws[1] * ws[2] * ws[3];
    const int64_t ny = ys[0] * ys[1] * ys[2] * ys[3];
    double *xv = random_vals(nx), *wv = random_vals(nw), *bv = random_vals(s->Cout),
           *dyv = random_vals(ny);

    /* Magnitudes. */
    sg_conv2d *c64 = plan(cpu, s, SG_DTYPE_F64);
    ctensors m = make_tensors(cpu, s, SG_DTYPE_F64);
    double *ax = abs_vals(xv, nx), *aw = abs_vals(wv, nw), *ab = abs_vals(bv, s->Cout),
           *ady = abs_vals(dyv, ny);
    tu_set(m.x, ax), tu_set(m.w, aw), tu_set(m.b, ab), tu_set(m.dy, ady);
    TU_OK(cpu, sg_conv2d_forward(cpu, c64, m.x, m.w, m.b, m.y));
    TU_OK(cpu, sg_conv2d_backward(cpu, c64, m.x, m.w, m.dy, m.dx, m.dw, m.db));
    double *mag[4] = {tu_get(m.y), tu_get(m.dx), tu_get(m.dw), tu_get(m.db)};
    TU_OK(cpu, sg_conv2d_forward(cpu, c64, m.x, m.w, NULL, m.y));
    double *mag_y0 = tu_get(m.y); /* y without b */
    /* Terms per output: y a group's taps and channels; dx at most every tap of a group's
     * output channels; dw and db every output position. */
    const int64_t Kpos = ys[0] * ys[1] * ys[2];
    const int64_t Ks[4] = {s->KH * s->KW * ws[3], s->KH * s->KW * (s->Cout / s->p.groups), Kpos,
                           Kpos};

    const sg_dtype dts[2] = {SG_DTYPE_F32, SG_DTYPE_BF16};
    for (int d = 0; d < 2; d++) {
        sg_dtype dt = dts[d];
        char what[256], w[400];
        describe(s, dt, what, sizeof what);
        sg_conv2d *cc = plan(cpu, s, dt), *cg = plan(gpu, s, dt);
        /* 1x1, stride 1, no padding, no groups: the linear op's matrix products, no cuDNN plan. */
        const bool gemm = s->KH == 1 && s->KW == 1 && s->p.stride_h == 1 && s->p.stride_w == 1 && s->p.pad_h == 0 &&
                          s->p.pad_w == 0 && s->p.groups == 1;
        TU_CHECK(cg->gemm == gemm, "%s: the plan's gemm %d, expected %d", what, cg->gemm, gemm);
        TU_CHECK(gemm || sg_conv2d_workspace_bytes(cg) > 0, "%s: no workspace", what);
        TU_CHECK(want_own < 0 || cg->own == (unsigned)want_own,
                 "%s [%s]: the plan runs passes 0x%x on stepgraph's depthwise kernels, expected "
                 "0x%x (1 forward, 2 data, 4 filter)",
                 what, kind, cg->own, (unsigned)want_own);
        ctensors rc = make_tensors(cpu, s, dt), t = make_tensors(gpu, s, dt);
        tu_set(rc.x, xv), tu_set(rc.w, wv), tu_set(rc.b, bv), tu_set(rc.dy, dyv);
        tu_set(t.x, xv), tu_set(t.w, wv), tu_set(t.b, bv), tu_set(t.dy, dyv);
        TU_OK(cpu, sg_conv2d_forward(cpu, cc, rc.x, rc.w, rc.b, rc.y));
        TU_OK(cpu, sg_conv2d_backward(cpu, cc, rc.x, rc.w, rc.dy, rc.dx, rc.dw, rc.db));

        poison_outputs(&t);
        TU_OK(gpu, sg_conv2d_forward(gpu, cg, t.x, t.w, t.b, t.y));
        TU_OK(gpu, sg_conv2d_backward(gpu, cg, t.x, t.w, t.dy, t.dx, t.dw, t.db));
        const sg_tensor *got[4] = {t.y, t.dx, t.dw, t.db}, *ref[4] = {rc.y, rc.dx, rc.dw, rc.db};
        /* Outputs of our kernels round once; db is conv_cuda.cu's either way. */
        const bool once[4] = {cg->own & SG_CONV_OWN_FWD, cg->own & SG_CONV_OWN_DATA,
                              cg->own & SG_CONV_OWN_FILTER, false};
        for (int i = 0; i < 4; i++) {
            label(w, sizeof w, "%s [%s]: %s vs CPU (%s)", what, kind, got[i]->name,
                  once[i] ? "stepgraph's depthwise kernel" : "cuDNN");
            close_mag(w, got[i], ref[i], mag[i], Ks[i], dt, once[i]);
        }

        /* Again: the same bits, and the launches. */
        void *first[4];
        for (int i = 0; i < 4; i++) first[i] = tu_raw(got[i]);
        poison_outputs(&t);
        uint64_t n0 = sg_ctx_launch_count(gpu);
        TU_OK(gpu, sg_conv2d_forward(gpu, cg, t.x, t.w, t.b, t.y));
        uint64_t n1 = sg_ctx_launch_count(gpu);
        TU_OK(gpu, sg_conv2d_backward(gpu, cg, t.x, t.w, t.dy, t.dx, t.dw, t.db));
        uint64_t n2 = sg_ctx_launch_count(gpu);
        const uint64_t want_fwd = cg->own & SG_CONV_OWN_FWD ? 1 : 2;
        const uint64_t want_bwd = 1 + (cg->own & SG_CONV_OWN_FILTER ? 2 : 1) + 2;
        TU_CHECK(gemm || (n1 - n0 == want_fwd && n2 - n1 == want_bwd), /* gemm: the linear op's own */
                 "%s [%s]: %llu + %llu launches, expected %llu + %llu (own passes 0x%x)", what,
                 kind, (unsigned long long)(n1 - n0), (unsigned long long)(n2 - n1),
                 (unsigned long long)want_fwd, (unsigned long long)want_bwd, cg->own);
        for (int i = 0; i < 4; i++)
            TU_CHECK(tu_same_bytes(got[i], first[i]),
                     "%s [%s]: %s differs between two identical runs", what, kind, got[i]->name);

        /* dx and db left out. */
        tu_poison(t.dw);
        TU_OK(gpu, sg_conv2d_backward(gpu, cg, t.x, t.w, t.dy, NULL, t.dw, NULL));
        TU_CHECK(tu_same_bytes(t.dw, first[2]), "%s [%s]: dw differs when dx and db are left out",
                 what, kind);

        /* y without b (ours: no bias term at all; cuDNN: no bias kernel). */
        TU_OK(cpu, sg_conv2d_forward(cpu, cc, rc.x, rc.w, NULL, rc.y));
        tu_poison(t.y);
        TU_OK(gpu, sg_conv2d_forward(gpu, cg, t.x, t.w, NULL, t.y));
        label(w, sizeof w, "%s [%s]: y without b vs CPU (%s)", what, kind,
              once[0] ? "stepgraph's depthwise kernel" : "cuDNN");
        close_mag(w, t.y, rc.y, mag_y0, Ks[0], dt, once[0]);
        for (int i = 0; i < 4; i++) free(first[i]);
        free_tensors(&rc), free_tensors(&t);
        sg_conv2d_destroy(cc), sg_conv2d_destroy(cg);
    }
    for (int i = 0; i < 4; i++) free(mag[i]);
    free(mag_y0);
    free(xv), free(wv), free(bv), free(dyv), free(ax), free(aw), free(ab), free(ady);
    free_tensors(&m);
    sg_conv2d_destroy(c64);
}

/* Layers of the vision workloads, at sizes the double reference computes in seconds. */
#define PARAMS(s, pad, g)                                                                     \
    {.stride_h = s, .stride_w = s, .pad_h = pad, .pad_w = pad, .dil_h = 1, .dil_w = 1, .groups = g}
static const cshape realistic[] = {
    /* ResNet's 3x3 at stage 1: 56x56x64 -> 64. */
    {.N = 4, .H = 56, .W = 56, .Cin = 64, .Cout = 64, .KH = 3, .KW = 3, .p = PARAMS(1, 1, 1)},
    /* The stem: 7x7 stride 2 pad 3 on 3 channels (a 112x112 image). */
    {.N = 2, .H = 112, .W = 112, .Cin = 3, .Cout = 64, .KH = 7, .KW = 7, .p = PARAMS(2, 3, 1)},
    /* EfficientNet's depthwise 3x3 on 96 channels, stride 2. */
    {.N = 4, .H = 56, .W = 56, .Cin = 96, .Cout = 96, .KH = 3, .KW = 3, .p = PARAMS(2, 1, 96)},
    /* ... and its 1x1 projection, 96 -> 24. */
    {.N = 4, .H = 28, .W = 28, .Cin = 96, .Cout = 24, .KH = 1, .KW = 1, .p = PARAMS(1, 0, 1)},
};

static void gpu_edges(sg_ctx *gpu)
{
    int64_t xs[4] = {1, 5, 5, 2}, ws[4] = {2, 3, 3, 2};
    sg_conv2d_params p = params(1, 1, 1, 1, 1, 1, 1);
    sg_conv2d *c = NULL;
    TU_FAILS(gpu, sg_conv2d_create(gpu, xs, ws, &p, SG_DTYPE_F64, &c), SG_ERR_DTYPE,
             "f64: CPU backend only");
    /* cuDNN's descriptors are int-sized. */
    int64_t huge[4] = {(int64_t)1 << 20, 64, 64, 1};
    int64_t w1[4] = {1, 1, 1, 1};
    TU_FAILS(gpu, sg_conv2d_create(gpu, huge, w1, &p, SG_DTYPE_F32, &c), SG_ERR_UNSUPPORTED,
             "cuDNN's descriptors take at most");
    TU_CHECK(c == NULL, "a failed create left a plan");
}

/* ---- gpu: stepgraph's depthwise kernels (dwconv_cuda.cu) ---- */

/* STEPGRAPH_DEPTHWISE for the plans made after it (NULL: unset, the default auto). */
static void depthwise_mode(const char *mode)
{
    if (mode)
        setenv("STEPGRAPH_DEPTHWISE", mode, 1);
    else
        unsetenv("STEPGRAPH_DEPTHWISE");
}

#define DEPTHWISE(n, h, w_, c, k, s, pad, dil)                                                \
    {.N = n, .H = h, .W = w_, .Cin = c, .Cout = c, .KH = k, .KW = k,                          \
     .p = {.stride_h = s, .stride_w = s, .pad_h = pad, .pad_w = pad, .dil_h = dil,             \
           .dil_w = dil, .groups = c}}

/* Odd sizes throughout (N OH OW a multiple of no tile: 4 along W, runs of 32 rows and more),
 * then EfficientNet-B0's layers at batch 4 to 8. Channels that are multiples of 8 take the
 * vector path (16 bytes: 8 bf16, 4 f32), the others the scalar one. */
static const cshape depthwise[] = {
    DEPTHWISE(2, 11, 9, 3, 3, 1, 1, 1),   /* C 3 */
    DEPTHWISE(3, 13, 7, 13, 5, 2, 2, 1),  /* 5x5 stride 2, C 13 */
    DEPTHWISE(2, 15, 17, 40, 3, 2, 1, 1), /* 3x3 stride 2, C 40 */
    DEPTHWISE(1, 21, 19, 96, 5, 1, 2, 1), /* 5x5 stride 1, C 96 */
    DEPTHWISE(2, 9, 11, 40, 3, 1, 2, 2),  /* dilation 2 */
    DEPTHWISE(2, 9, 7, 13, 3, 2, 0, 2),   /* stride 2 and dilation 2, no padding */
    DEPTHWISE(2, 13, 11, 13, 7, 2, 3, 1), /* 7x7 stride 2 */
    DEPTHWISE(3, 7, 9, 96, 1, 1, 0, 1),   /* 1x1 */
    DEPTHWISE(1, 10, 8, 5, 3, 3, 2, 1),   /* stride 3, padding 2: residues with fewer inputs */
    /* Everything asymmetric: 3x5, stride 1x2, padding 2x0, dilation 2x1, C 24. */
    {.N = 2, .H = 11, .W = 13, .Cin = 24, .Cout = 24, .KH = 3, .KW = 5,
     .p = {.stride_h = 1, .stride_w = 2, .pad_h = 2, .pad_w = 0, .dil_h = 2, .dil_w = 1,
           .groups = 24}},
    DEPTHWISE(4, 112, 112, 32, 3, 1, 1, 1),
    DEPTHWISE(4, 112, 112, 96, 3, 2, 1, 1),
    DEPTHWISE(8, 28, 28, 240, 5, 1, 2, 1),
    DEPTHWISE(8, 14, 14, 672, 5, 2, 2, 1),
    DEPTHWISE(8, 7, 7, 1152, 5, 1, 2, 1),
    DEPTHWISE(8, 7, 7, 1152, 3, 1, 1, 1),
};
#define N_DEPTHWISE (sizeof depthwise / sizeof *depthwise)

/* Our kernels' vector path (aligned tensors, C a multiple of 16 bytes of channels) and scalar
 * path (the same shapes as views one element into a buffer, 4 or 2 bytes off 16) give the same
 * bits for y, dx and dw: they add in one order whatever the path. */
static void gpu_dw_paths(sg_ctx *gpu, const cshape *s, sg_dtype dt)
{
    char what[256];
    describe(s, dt, what, sizeof what);
    sg_conv2d *c = plan(gpu, s, dt);
    TU_CHECK(c->own == SG_CONV_OWN_ALL, "%s: own passes 0x%x under STEPGRAPH_DEPTHWISE=own", what,
             c->own);
    int64_t shapes[6][4];
    x_shape(s, shapes[0]), w_shape(s, shapes[1]), y_shape(s, shapes[2]); /* x, w, dy */
    x_shape(s, shapes[3]), w_shape(s, shapes[4]), y_shape(s, shapes[5]); /* dx, dw, y */
    const char *names[6] = {"x", "w", "dy", "dx", "dw", "y"};
    sg_tensor *t[2][6], *base[2][6];
    double *vals[3];
    for (int o = 0; o < 2; o++)
        for (int i = 0; i < 6; i++)
            t[o][i] = tu_maybe_view(gpu, dt, 4, shapes[i], o == 1, names[i], &base[o][i]);
    for (int i = 0; i < 3; i++) {
        vals[i] = tu_random(t[0][i], -1, 1);
        tu_set(t[1][i], vals[i]);
    }
    sg_tensor *b = tu_tensor1(gpu, dt, s->Cout, "b");
    free(tu_random(b, -1, 1));
    void *bits[3] = {NULL, NULL, NULL};
    for (int o = 0; o < 2; o++) {
        sg_tensor **u = t[o];
        tu_poison(u[3]), tu_poison(u[4]), tu_poison(u[5]);
        TU_OK(gpu, sg_conv2d_forward(gpu, c, u[0], u[1], b, u[5]));
        TU_OK(gpu, sg_conv2d_backward(gpu, c, u[0], u[1], u[2], u[3], u[4], NULL));
        for (int i = 0; i < 3; i++) {
            if (o == 0) {
                bits[i] = tu_raw(u[3 + i]);
                continue;
            }
            TU_CHECK(tu_same_bytes(u[3 + i], bits[i]),
                     "%s: %s differs between our vector path (aligned) and scalar path "
                     "(misaligned views)",
                     what, names[3 + i]);
        }
    }
    for (int i = 0; i < 3; i++) free(bits[i]), free(vals[i]);
    for (int o = 0; o < 2; o++)
        for (int i = 0; i < 6; i++) sg_tensor_destroy(t[o][i]), sg_tensor_destroy(base[o][i]);
    sg_tensor_destroy(b);
    sg_conv2d_destroy(c);
}

/* STEPGRAPH_DEPTHWISE: an unknown value refused by name; own, cudnn, then own again for one
 * shape in one context (the choice is remembered per mode, not only per shape); convolutions
 * that are not depthwise stay on cuDNN under own. */
static void gpu_dw_modes(sg_ctx *gpu)
{
    const cshape s = DEPTHWISE(2, 9, 9, 16, 3, 1, 1, 1);
    int64_t xs[4], ws[4];
    x_shape(&s, xs), w_shape(&s, ws);
    sg_conv2d *c = NULL;
    depthwise_mode("fast");
    TU_FAILS(gpu, sg_conv2d_create(gpu, xs, ws, &s.p, SG_DTYPE_BF16, &c), SG_ERR_INVALID,
             "STEPGRAPH_DEPTHWISE is 'fast': expected 'auto' (the default), 'own' or 'cudnn'");
    TU_CHECK(c == NULL, "a failed create left a plan");
    const char *modes[4] = {"own", "cudnn", "own", "auto"};
    for (int i = 0; i < 4; i++) {
        depthwise_mode(modes[i]);
        c = plan(gpu, &s, SG_DTYPE_BF16);
        const unsigned want = !strcmp(modes[i], "own") ? SG_CONV_OWN_ALL : 0;
        TU_CHECK(i == 3 || c->own == want,
                 "STEPGRAPH_DEPTHWISE=%s (plan %d of one shape): own passes 0x%x, expected 0x%x",
                 modes[i], i, c->own, want);
        TU_CHECK(c->own <= SG_CONV_OWN_ALL, "auto: own passes 0x%x", c->own);
        sg_conv2d_destroy(c);
    }
    depthwise_mode("own");
    cshape grouped = s, multiplier = s;
    grouped.p.groups = 8;      /* 2 channels per group */
    multiplier.Cout = 2 * s.Cin; /* groups = Cin, 2 outputs per input channel */
    const cshape *others[2] = {&grouped, &multiplier};
    for (int i = 0; i < 2; i++) {
        char what[256];
        describe(others[i], SG_DTYPE_F32, what, sizeof what);
        c = plan(gpu, others[i], SG_DTYPE_F32);
        TU_CHECK(c->own == 0, "%s (not depthwise) under own: own passes 0x%x", what, c->own);
        sg_conv2d_destroy(c);
    }
    depthwise_mode(NULL);
}

/* Our kernels against the CPU (forced: STEPGRAPH_DEPTHWISE=own), on the shapes above and random
 * depthwise ones; their two paths; captured graphs; then cuDNN forced and auto on a few. */
static void gpu_depthwise(sg_ctx *gpu, sg_ctx *cpu)
{
    const sg_dtype dts[2] = {SG_DTYPE_F32, SG_DTYPE_BF16};
    depthwise_mode("own");
    for (size_t i = 0; i < N_DEPTHWISE; i++)
        gpu_case(gpu, cpu, &depthwise[i], "depthwise, ours", SG_CONV_OWN_ALL);
    for (int r = 0; r < 3; r++) {
        cshape s = random_case(K_DEPTHWISE);
        gpu_case(gpu, cpu, &s, "random depthwise, ours", SG_CONV_OWN_ALL);
    }
    for (size_t i = 0; i < N_DEPTHWISE; i++)
        for (int d = 0; d < 2; d++)
            if (depthwise[i].Cin % (dts[d] == SG_DTYPE_BF16 ? 8 : 4) == 0)
                gpu_dw_paths(gpu, &depthwise[i], dts[d]);
    for (int d = 0; d < 2; d++) {
        capture_case(gpu, &depthwise[1], dts[d]);
        capture_case(gpu, &depthwise[12], dts[d]);
    }
    depthwise_mode("cudnn");
    gpu_case(gpu, cpu, &depthwise[3], "depthwise, cudnn", 0);
    depthwise_mode("auto");
    gpu_case(gpu, cpu, &depthwise[1], "depthwise, auto", -1);
    gpu_case(gpu, cpu, &depthwise[12], "depthwise, auto", -1);
    capture_case(gpu, &depthwise[14], SG_DTYPE_BF16);
    depthwise_mode(NULL);
    gpu_dw_modes(gpu);
}

static void gpu_tests(void)
{
    sg_ctx *gpu = tu_ctx(SG_BACKEND_CUDA);
#ifndef SG_HAVE_CUDNN
    {
        int64_t xs[4] = {1, 5, 5, 2}, ws[4] = {2, 3, 3, 2};
        sg_conv2d_params p = params(1, 1, 1, 1, 1, 1, 1);
        sg_conv2d *c = NULL;
        TU_FAILS(gpu, sg_conv2d_create(gpu, xs, ws, &p, SG_DTYPE_F32, &c), SG_ERR_UNSUPPORTED,
                 "no cuDNN");
        sg_ctx_destroy(gpu);
        if (tu_failures) exit(tu_finish("test_conv"));
        printf("SKIP: this build has no cuDNN: the CUDA convolution is unsupported (checked)\n");
        exit(TU_SKIP);
    }
#endif
    sg_ctx *cpu = tu_ctx(SG_BACKEND_CPU);
    for (int k = 0; k < K_COUNT; k++) {
        cshape s = random_case(k);
        gpu_case(gpu, cpu, &s, kind_names[k], -1);
    }
    for (size_t i = 0; i < sizeof realistic / sizeof *realistic; i++)
        gpu_case(gpu, cpu, &realistic[i], "realistic", -1);
    gpu_edges(gpu);
    const sg_dtype dts[2] = {SG_DTYPE_F32, SG_DTYPE_BF16};
    for (int d = 0; d < 2; d++) {
        capture_case(gpu, &realistic[0], dts[d]);
        capture_case(gpu, &realistic[2], dts[d]);
        cshape s = random_case(K_ANY);
        capture_case(gpu, &s, dts[d]);
    }
    gpu_depthwise(gpu, cpu);
    sg_ctx_destroy(cpu);
    sg_ctx_destroy(gpu);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "cpu";
    tu_seed("test_conv");
    if (!strcmp(mode, "gpu"))
        gpu_tests();
    else
        cpu_tests();
    return tu_finish("test_conv");
}
