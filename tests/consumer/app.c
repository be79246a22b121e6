/* app.c: a program a user of the installed package writes: it includes only <stepgraph.h>,
 * trains mlp-32-2-8 under step scope (a captured graph, or a recorded plan on the CPU) and
 * checks through the API that the loss fell. Built by tests/install_test.sh with
 * find_package(stepgraph) and with pkg-config. Usage: app [cpu|cuda]. */
#include <stepgraph.h>

#include <stdio.h>
#include <string.h>

#define CHECK(ctx, call)                                                                  \
    do {                                                                                  \
        if ((call) != SG_OK) {                                                            \
            fprintf(stderr, "app: %s: %s\n", #call, sg_ctx_last_error(ctx));              \
            return 1;                                                                     \
        }                                                                                 \
    } while (0)

int main(int argc, char **argv)
{
    sg_ctx_options o = sg_ctx_options_default();
    o.backend = argc > 1 && !strcmp(argv[1], "cuda") ? SG_BACKEND_CUDA : SG_BACKEND_CPU;
    sg_ctx *ctx = NULL;
    CHECK(NULL, sg_ctx_create(&o, &ctx));
    sg_model *m = NULL;
    sg_optim *opt = NULL;
    sg_trainer *t = NULL;
    CHECK(ctx, sg_model_create(ctx, "mlp-32-2-8", 7, &m));
    CHECK(ctx, sg_optim_create(ctx, m, SG_OPTIM_ADAMW, &opt));
    sg_trainer_options to = sg_trainer_options_default();
    to.scope = SG_SCOPE_STEP;
    CHECK(ctx, sg_trainer_create(m, opt, &to, &t));
    float first = 0, last = 0;
    for (int s = 0; s < 200; s++) {
        CHECK(ctx, sg_trainer_step(t, s));
        if (s == 0) CHECK(ctx, sg_model_loss_read(m, &first));
    }
    CHECK(ctx, sg_model_loss_read(m, &last));
    sg_trainer_stats st;
    CHECK(ctx, sg_trainer_get_stats(t, &st));
    printf("app: %s, loss %.4f -> %.4f, %d graphs, %llu replays\n", sg_ctx_device_name(ctx), first, last, st.graphs,
           (unsigned long long)st.replays);
    int ok = last < first && st.graphs == 1 && st.replays > 0;
    sg_trainer_destroy(t);
    sg_optim_destroy(opt);
    sg_model_destroy(m);
    sg_ctx_destroy(ctx);
    if (!ok) fprintf(stderr, "app: the loss did not fall, or nothing was replayed\n");
    return ok ? 0 : 1;
}
