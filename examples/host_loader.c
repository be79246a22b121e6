/* host_loader.c: batches from your own loader on the host, fed to a step graph while the
 * previous step runs.
 *
 * The loader holds a data set in host memory (as if read from a file: points x and targets
 * t = tanh(x W) of a random teacher W on a few of the inputs) and, each epoch, visits the rows in a fresh shuffled
 * order, gathering each batch into its own buffer. An MLP (Linear + GELU, Linear + GELU,
 * Linear) fits it with MSE and AdamW under step scope, the whole step one graph. The batches
 * reach the device through sg_dataset_feed: batch s+1 is fed right after step s is queued, so
 * its copy (pinned staging buffer, copy stream) runs while step s runs.
 *
 * The program trains two copies of the model from the same seed on the same batches: one fed
 * by the loader, one reading them from a device-resident data set (the batches gathered on the
 * GPU by the step graph itself). It checks that both end bit for bit equal, prints the time per
 * step of each (rounds alternate), and with --trace FILE (CUDA, with CUPTI) profiles a few fed
 * steps, writes them as a Perfetto trace and counts the batch copies that ran while a kernel of
 * the step before was running. Usage: host_loader [cpu|cuda] [--trace FILE] */
#include <stepgraph.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static sg_ctx *ctx;

#define TRY(call)                                                                          \
    do {                                                                                   \
        if ((call) != SG_OK) {                                                             \
            fprintf(stderr, "host_loader: %s: %s\n", #call, sg_ctx_last_error(ctx));       \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

/* Sizes: small on the CPU; on the GPU, a step of about a millisecond and 4 MB of batch. */
static int64_t IN, HID, OUT, B, ROWS;
enum { WARM = 10, ROUNDS = 5, TRACE_STEPS = 6 };
static int PER_ROUND;

static void *xmalloc(size_t n)
{
    void *p = malloc(n);
    if (!p) {
        fprintf(stderr, "host_loader: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

/* ---- the loader: rows in host memory, a shuffled order per epoch ---------------------- */

typedef struct loader {
    const float *x, *t;       /* ROWS x IN, ROWS x OUT */
    int64_t *order;           /* this epoch's permutation of the rows */
    int64_t epoch;
    float *bx, *bt;           /* the batch being handed out */
} loader;

static void loader_init(loader *L, const float *x, const float *t)
{
    L->x = x, L->t = t, L->epoch = -1;
    L->order = xmalloc((size_t)ROWS * sizeof *L->order);
    L->bx = xmalloc((size_t)(B * IN) * sizeof(float));
    L->bt = xmalloc((size_t)(B * OUT) * sizeof(float));
}

static void loader_free(loader *L)
{
    free(L->order), free(L->bx), free(L->bt);
}

/* Batch k: rows k*B .. k*B+B-1 of the sequence of epochs, each epoch a Fisher-Yates shuffle. */
static void loader_batch(loader *L, int64_t k)
{
    for (int64_t i = 0; i < B; i++) {
        int64_t g = k * B + i, e = g / ROWS;
        if (e != L->epoch) {
            sg_rng r = {1000 + (uint64_t)e};
            for (int64_t j = 0; j < ROWS; j++) L->order[j] = j;
            for (int64_t j = ROWS - 1; j > 0; j--) {
                int64_t u = (int64_t)(sg_rng_next(&r) % (uint64_t)(j + 1)), tmp = L->order[j];
                L->order[j] = L->order[u], L->order[u] = tmp;
            }
            L->epoch = e;
        }
        int64_t row = L->order[g % ROWS];
        memcpy(L->bx + i * IN, L->x + row * IN, (size_t)IN * sizeof(float));
        memcpy(L->bt + i * OUT, L->t + row * OUT, (size_t)OUT * sizeof(float));
    }
}

static void feed(sg_dataset *d, loader *L, int64_t k)
{
    loader_batch(L, k);
    TRY(sg_dataset_feed(d, k, L->bx, (size_t)(B * IN) * sizeof(float), L->bt, (size_t)(B * OUT) * sizeof(float)));
}

/* ---- the model ---------------------------------------------------------------------- */

typedef struct run {
    sg_model *m;
    sg_optim *o;
    sg_trainer *t;
} run;

static run start(sg_dataset *d, uint64_t seed)
{
    sg_builder_options bo = sg_builder_options_default();
    bo.batch = B;
    sg_builder *b;
    TRY(sg_builder_create(ctx, "mlp-fed", &bo, &b));
    sg_module *l[3], *root;
    TRY(sg_module_linear(b, "fc1", IN, HID, 1, SG_ACT_GELU, &l[0]));
    TRY(sg_module_linear(b, "fc2", HID, HID, 1, SG_ACT_GELU, &l[1]));
    TRY(sg_module_linear(b, "out", HID, OUT, 1, SG_ACT_NONE, &l[2]));
    TRY(sg_module_sequential(b, "mlp", l, 3, &root));
    run r;
    TRY(sg_builder_finish(b, root, SG_LOSS_MSE, d, seed, &r.m));
    TRY(sg_optim_create(ctx, r.m, SG_OPTIM_ADAMW, &r.o));
    sg_trainer_options to = sg_trainer_options_default();
    to.scope = SG_SCOPE_STEP;
    TRY(sg_trainer_create(r.m, r.o, &to, &r.t));
    return r;
}

static void stop(run *r)
{
    sg_trainer_destroy(r->t);
    sg_optim_destroy(r->o);
    sg_model_destroy(r->m);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* ---- the trace: batch copies during the previous step's kernels -------------------------- */

/* Profiles TRACE_STEPS fed steps (from step s), writes the trace and counts the host-to-device
 * copies that overlap a kernel on another stream. */
static void trace(run *fed, sg_dataset *fd, loader *L, int64_t s, const char *path)
{
    sg_prof *p;
    if (sg_prof_create(ctx, &p) != SG_OK) {
        printf("  trace: not written: %s\n", sg_ctx_last_error(ctx));
        return;
    }
    TRY(sg_prof_start(p));
    for (int64_t i = s; i < s + TRACE_STEPS; i++) {
        TRY(sg_trainer_step(fed->t, i));
        feed(fd, L, i + 1);
    }
    TRY(sg_prof_stop(p, NULL));
    size_t n;
    const sg_prof_record *r = sg_prof_records(p, &n);
    TRY(sg_prof_write_trace(ctx, r, n, path));
    int copies = 0, overlapped = 0;
    for (size_t i = 0; i < n; i++) {
        if (r[i].kind != SG_PROF_KIND_MEMCPY || !r[i].name || strcmp(r[i].name, "memcpy HtoD") || !r[i].end_ns)
            continue;
        copies++;
        for (size_t j = 0; j < n; j++)
            if (r[j].kind == SG_PROF_KIND_KERNEL && r[j].stream_id != r[i].stream_id && r[j].start_ns < r[i].end_ns &&
                r[i].start_ns < r[j].end_ns) {
                overlapped++;
                break;
            }
    }
    printf("  trace %s: %d fed steps; %d of %d batch copies ran while a kernel of the running step ran\n", path,
           TRACE_STEPS, overlapped, copies);
    sg_prof_destroy(p);
}

int main(int argc, char **argv)
{
    sg_ctx_options o = sg_ctx_options_default();
    const char *trace_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "cuda")) o.backend = SG_BACKEND_CUDA;
        else if (!strcmp(argv[i], "cpu")) o.backend = SG_BACKEND_CPU;
        else if (!strcmp(argv[i], "--trace") && i + 1 < argc) trace_path = argv[++i];
        else {
            fprintf(stderr, "usage: host_loader [cpu|cuda] [--trace FILE]\n");
            return 2;
        }
    }
    if (sg_ctx_create(&o, &ctx) != SG_OK) {
        fprintf(stderr, "host_loader: %s\n", sg_ctx_last_error(NULL));
        return 1;
    }
    int gpu = o.backend == SG_BACKEND_CUDA;
    IN = gpu ? 1024 : 32, HID = gpu ? 4096 : 64, OUT = gpu ? 1024 : 8, B = gpu ? 512 : 16;
    ROWS = 8 * B + B / 2; /* epochs end mid-batch */
    PER_ROUND = gpu ? 40 : 4;

    /* The data "on disk": x ~ N(0, 1), t = tanh(x[:, :K] W / sqrt(K)), the teacher reading the
     * first K = 32 inputs (cheap to make on the host). */
    const int64_t K = IN < 32 ? IN : 32;
    float *x = xmalloc((size_t)(ROWS * IN) * sizeof(float)), *t = xmalloc((size_t)(ROWS * OUT) * sizeof(float));
    float *w = xmalloc((size_t)(K * OUT) * sizeof(float));
    sg_rng r = {42};
    for (int64_t i = 0; i < ROWS * IN; i++) x[i] = (float)sg_rng_normal(&r);
    for (int64_t i = 0; i < K * OUT; i++) w[i] = (float)sg_rng_normal(&r);
    for (int64_t i = 0; i < ROWS; i++)
        for (int64_t j = 0; j < OUT; j++) {
            double acc = 0;
            for (int64_t k = 0; k < K; k++) acc += (double)x[i * IN + k] * w[k * OUT + j];
            t[i * OUT + j] = (float)tanh(acc / sqrt((double)K));
        }

    /* The device-resident copy: the very batches the loader will hand out, in order. */
    const int64_t steps = WARM + ROUNDS * PER_ROUND + (trace_path ? TRACE_STEPS : 0);
    loader L;
    loader_init(&L, x, t);
    sg_tensor *gx, *gt;
    TRY(sg_tensor_create(ctx, SG_DTYPE_F32, 2, (int64_t[]){steps * B, IN}, "x", &gx));
    TRY(sg_tensor_create(ctx, SG_DTYPE_F32, 2, (int64_t[]){steps * B, OUT}, "t", &gt));
    for (int64_t k = 0; k < steps; k++) {
        loader_batch(&L, k);
        sg_tensor *vx, *vt; /* rows k*B.. of the data set, as views */
        TRY(sg_tensor_view(gx, k * B * IN, 2, (int64_t[]){B, IN}, "bx", &vx));
        TRY(sg_tensor_view(gt, k * B * OUT, 2, (int64_t[]){B, OUT}, "bt", &vt));
        TRY(sg_tensor_copy_from_host(vx, L.bx, (size_t)(B * IN) * sizeof(float)));
        TRY(sg_tensor_copy_from_host(vt, L.bt, (size_t)(B * OUT) * sizeof(float)));
        sg_tensor_destroy(vx), sg_tensor_destroy(vt);
    }
    loader_free(&L);
    sg_dataset *gd, *fd;
    TRY(sg_dataset_create(ctx, gx, gt, &gd));
    TRY(sg_dataset_create_fed(ctx, SG_DTYPE_F32, 2, (int64_t[]){B, IN}, SG_DTYPE_F32, 2, (int64_t[]){B, OUT}, &fd));

    const uint64_t seed = 3;
    run dev = start(gd, seed), fed = start(fd, seed);
    loader_init(&L, x, t);
    feed(fd, &L, 0);
    float first = 0;
    int64_t sd = 0, sf = 0; /* the next step of each */
    for (; sd < WARM; sd++) TRY(sg_trainer_step(dev.t, sd));
    for (; sf < WARM; sf++) {
        TRY(sg_trainer_step(fed.t, sf));
        feed(fd, &L, sf + 1); /* while step sf runs */
        if (sf == 0) TRY(sg_model_loss_read(fed.m, &first));
    }
    double ms_dev[ROUNDS], ms_fed[ROUNDS];
    float loss_dev, loss_fed;
    for (int k = 0; k < ROUNDS; k++) {
        TRY(sg_model_loss_read(dev.m, &loss_dev)); /* both idle */
        TRY(sg_model_loss_read(fed.m, &loss_fed));
        double t0 = now_ms();
        for (int i = 0; i < PER_ROUND; i++, sd++) TRY(sg_trainer_step(dev.t, sd));
        TRY(sg_model_loss_read(dev.m, &loss_dev));
        double t1 = now_ms();
        for (int i = 0; i < PER_ROUND; i++, sf++) {
            TRY(sg_trainer_step(fed.t, sf));
            feed(fd, &L, sf + 1);
        }
        TRY(sg_model_loss_read(fed.m, &loss_fed));
        double t2 = now_ms();
        ms_dev[k] = (t1 - t0) / (PER_ROUND), ms_fed[k] = (t2 - t1) / (PER_ROUND);
    }
    qsort(ms_dev, ROUNDS, sizeof *ms_dev, cmp_double);
    qsort(ms_fed, ROUNDS, sizeof *ms_fed, cmp_double);
    if (trace_path) {
        for (int64_t i = 0; i < TRACE_STEPS; i++, sd++) TRY(sg_trainer_step(dev.t, sd));
        trace(&fed, fd, &L, sf, trace_path);
        sf += TRACE_STEPS;
    }
    TRY(sg_model_loss_read(dev.m, &loss_dev));
    TRY(sg_model_loss_read(fed.m, &loss_fed));

    /* The same batches in the same order: the same bits. */
    sg_tensor *pd = sg_model_params(dev.m), *pf = sg_model_params(fed.m);
    size_t bytes = (size_t)sg_tensor_numel(pd) * sizeof(float);
    float *hd = xmalloc(bytes), *hf = xmalloc(bytes);
    TRY(sg_tensor_copy_to_host(pd, hd, bytes));
    TRY(sg_tensor_copy_to_host(pf, hf, bytes));
    int same = sd == sf && !memcmp(hd, hf, bytes) && !memcmp(&loss_dev, &loss_fed, sizeof loss_dev);
    printf("host_loader on %s: MLP %lld-%lld-%lld-%lld, batch %lld (%.0f kB fed per step), %lld steps under step "
           "scope\n", sg_ctx_device_name(ctx), (long long)IN, (long long)HID, (long long)HID, (long long)OUT,
           (long long)B, (double)(B * (IN + OUT)) * 4 / 1e3, (long long)sf);
    printf("  loss %.5f -> %.5f; fed and device-resident runs %s\n", first, loss_fed,
           same ? "bit-exact" : "DIFFER");
    printf("  ms/step (median of %d rounds of %d): device-resident %.4f, host-fed %.4f (fed/resident %.3f)\n",
           ROUNDS, PER_ROUND, ms_dev[ROUNDS / 2], ms_fed[ROUNDS / 2], ms_fed[ROUNDS / 2] / ms_dev[ROUNDS / 2]);
    free(hd), free(hf), free(x), free(t), free(w);
    loader_free(&L);
    stop(&dev), stop(&fed);
    sg_ctx_destroy(ctx);
    if (!same || !(loss_fed < 0.8f * first)) {
        fprintf(stderr, "host_loader: %s\n", same ? "the loss did not fall by a fifth" : "fed and resident differ");
        return 1;
    }
    return 0;
}
