/* dist.c: what the data-parallel commands (train, trace) share: the --gpus and --bucket-mib
 * options and the checks of a run, the launcher that starts one copy of the command per GPU
 * (sg_dist_launch), and a worker's side: its context on its GPU, joining the run, the report. */
#define _POSIX_C_SOURCE 200809L

#include "cli/cli.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char rank_tag[48]; /* " [rank r of n]" in a data-parallel worker's messages */

sg_cli_dist sg_cli_dist_default(void)
{
    return (sg_cli_dist){.nnodes = 1, .bucket_mib = 4, .timeout_s = 300};
}

bool sg_cli_dist_opt(const char *cmd, int argc, char **argv, int *i, sg_cli_dist *d, bool *bad)
{
    const char *v = NULL;
    if (sg_cli_opt(argc, argv, i, "--gpus", &v, bad)) {
        *bad = *bad || !sg_cli_int(cmd, "--gpus", v, 1, 64, &d->gpus);
    } else if (sg_cli_opt(argc, argv, i, "--bucket-mib", &v, bad)) {
        *bad = *bad || !sg_cli_float(cmd, "--bucket-mib", v, 1.0 / 1024, 4096, &d->bucket_mib);
        d->opts = true;
    } else if (!strcmp(argv[*i], "--shard-optimizer")) {
        d->shard_optimizer = d->opts = true;
        (*i)++;
    } else {
        return false;
    }
    return true;
}

bool sg_cli_dist_check(const char *cmd, const sg_cli_dist *d, sg_backend b, const sg_trainer_options *tr,
                       const char *model)
{
    const char *err = NULL;
    char buf[256];
    long long world = d->gpus * d->nnodes;
    long long w = 0, depth = 0, batch = 0;
    char kind[16] = "";
    if (!d->gpus) return true;
    if (tr->n_buckets || tr->n_seq_buckets)
        err = "--gpus does not combine with --batch-sizes or --seq-lens yet";
    else if (tr->stop_nonfinite || tr->stop_on_loss)
        err = "--gpus does not combine with --stop-nonfinite or --stop-loss yet (a step's all-reduce cannot sit "
              "in the early-stop loop's body)";
    else if (d->nnodes > 1 && b == SG_BACKEND_CPU)
        err = "--nnodes needs the CUDA backend: the CPU backend's collectives run over local sockets, on one host";
    else if (sscanf(model, "%15[a-z]-%lld-%lld-%lld", kind, &w, &depth, &batch) == 4 && batch % world)
        snprintf(buf, sizeof buf, "--gpus %lld%s: the global batch %lld of %s does not split into %lld equal parts, "
                 "one per rank", d->gpus, d->nnodes > 1 ? " on each node" : "", batch, model, world), err = buf;
    if (err) fprintf(stderr, "stepgraph %s: %s\n", cmd, err);
    return err == NULL;
}

bool sg_cli_dist_env(const char *cmd, sg_dist_env *env, int *worker)
{
    *worker = 0;
    if (sg_dist_env_read(env, worker) != SG_OK) {
        fprintf(stderr, "stepgraph %s: %s\n", cmd, sg_ctx_last_error(NULL));
        return false;
    }
    return true;
}

int sg_cli_dist_launch(const char *cmd, int argc, char **argv, sg_backend b, const sg_cli_dist *d)
{
    if (b == SG_BACKEND_AUTO) b = sg_cuda_available() ? SG_BACKEND_CUDA : SG_BACKEND_CPU;
    if (b == SG_BACKEND_CPU && d->nnodes > 1) {
        fprintf(stderr, "stepgraph %s: --nnodes needs the CUDA backend, and no GPU is usable here: the CPU "
                "backend's collectives run over local sockets, on one host\n", cmd);
        return SG_EXIT_FAIL;
    }
    sg_dist_launch_options lo;
    memset(&lo, 0, sizeof lo);
    lo.local_world = (int)d->gpus, lo.nnodes = (int)d->nnodes, lo.node_rank = (int)d->node_rank;
    lo.master = d->master, lo.timeout_s = d->timeout_s;
    /* Node 0 makes the run's id (NCCL's answers from this process until every rank joined). */
    if (d->node_rank == 0 && sg_dist_id_create(b, &lo.id) != SG_OK) {
        fprintf(stderr, "stepgraph %s: --gpus %lld: %s\n", cmd, d->gpus, sg_ctx_last_error(NULL));
        return SG_EXIT_FAIL;
    }
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) snprintf(self, sizeof self, "%s", "stepgraph"); /* found on PATH, then */
    else self[n] = '\0';
    char **wargv = calloc((size_t)argc + 5, sizeof *wargv);
    if (!wargv) {
        fprintf(stderr, "stepgraph %s: launch: %s\n", cmd, sg_ctx_last_error(NULL));
        return SG_EXIT_FAIL;
    }
    int k = 0;
    wargv[k++] = self;
    for (int i = 0; i < argc; i++) wargv[k++] = argv[i]; /* argv[0] is the command's name */
    wargv[k++] = "--backend";
    wargv[k++] = (char *)sg_backend_name(b);
    wargv[k] = NULL;
    lo.argv = wargv;
    fprintf(stderr, "stepgraph %s: data parallel: %lld rank%s on this host%s (%s backend%s); rank 0 reports\n", cmd,
            d->gpus, d->gpus > 1 ? "s" : "", d->nnodes > 1 ? ", one node of several" : "", sg_backend_name(b),
            b == SG_BACKEND_CPU ? ": CPU processes, collectives over local sockets" : ", one GPU each, NCCL");
    fflush(stdout);
    sg_dist_launch_result res;
    sg_status st = sg_dist_launch(&lo, &res);
    free(wargv);
    if (st != SG_OK) {
        fprintf(stderr, "stepgraph %s: %s%s\n", cmd, sg_ctx_last_error(NULL),
                res.failed_rank >= 0 ? " (its own error is above)" : "");
        return res.interrupted_by ? 128 + res.interrupted_by : SG_EXIT_FAIL; /* 130, 143 */
    }
    return 0;
}

sg_ctx *sg_cli_dist_ctx(const char *cmd, sg_backend b, const sg_dist_env *env)
{
    snprintf(rank_tag, sizeof rank_tag, " [rank %d of %d]", env->rank, env->world);
    if (env->rank != 0 && !freopen("/dev/null", "w", stdout)) { /* rank 0 reports; errors still go to stderr */ }
    sg_ctx_options co = sg_ctx_options_default();
    co.backend = b;
    co.device = b == SG_BACKEND_CUDA ? env->local_rank : 0;
    sg_ctx *ctx;
    if (sg_ctx_create(&co, &ctx) != SG_OK) {
        fprintf(stderr, "stepgraph %s%s: %s\n", cmd, rank_tag, sg_ctx_last_error(NULL));
        return NULL;
    }
    return ctx;
}

const char *sg_cli_dist_tag(void)
{
    return rank_tag;
}

sg_status sg_cli_dist_join(sg_ctx *ctx, const sg_dist_env *env, const sg_cli_dist *d, sg_model_options *mo,
                           sg_trainer_options *tr, sg_dist **out)
{
    sg_dist_options dopt = sg_dist_options_default();
    dopt.rank = env->rank, dopt.world = env->world, dopt.id = env->id;
    dopt.bucket_bytes = (size_t)(d->bucket_mib * 1048576.0);
    dopt.timeout_s = d->timeout_s;
    sg_status st = sg_dist_create(ctx, &dopt, out);
    if (st != SG_OK) return st;
    mo->shard = env->rank, mo->shards = env->world;
    tr->dist = *out;
    tr->shard_optimizer = d->shard_optimizer;
    if (tr->scope != SG_SCOPE_EAGER && tr->warmup < SG_DIST_MIN_WARMUP) tr->warmup = SG_DIST_MIN_WARMUP;
    return SG_OK;
}

void sg_cli_dist_print(const sg_dist *dist, double bucket_mib)
{
    sg_dist_stats ds;
    if (dist && sg_dist_get_stats(dist, &ds) == SG_OK)
        printf("data parallel: %d ranks, each on 1/%d of every batch; %d gradient all-reduces a step (buckets of "
               "%.3g MiB) averaging %.3f MiB; captures checked on every rank: %d\n", sg_dist_world(dist),
               sg_dist_world(dist), ds.buckets_per_step, bucket_mib, ds.bytes_per_step / 1048576.0, ds.checks);
}
