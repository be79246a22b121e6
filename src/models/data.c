/* data.c: the synthetic data set. Inputs are N(0,1); labels are the argmax of a fixed random
 * linear teacher, so the task is learnable and a falling loss proves learning. Generated on
 * the host from a seed (the same on every backend), uploaded once. */
#include "models/model.h"

#include <stdlib.h>

sg_status sg_data_teacher(sg_model *m, uint64_t seed)
{
    /* Rows are drawn for the whole batch (global_batch) in order, and a data-parallel shard
     * keeps its own (rows shard*b .. of each batch of b per shard), so shards together hold
     * exactly the data set of a model of the whole batch. */
    int64_t in = m->in_dim, C = m->classes, nb = m->n_batches, b = m->data_y->numel / nb;
    int64_t S = m->shards > 1 ? m->shards : 1, Bg = b * S, n = m->data_x->numel, rows = m->data_y->numel;
    float *x = malloc((size_t)n * sizeof *x), *row = malloc((size_t)in * sizeof *row);
    int32_t *y = malloc((size_t)rows * sizeof *y);
    double *teacher = malloc((size_t)(C * in) * sizeof *teacher);
    if (!x || !y || !teacher || !row) {
        free(x), free(y), free(teacher), free(row);
        return sg_fail(m->ctx, SG_ERR_OOM, "sg_model_create: out of host memory for the data set");
    }
    sg_rng r = {seed};
    for (int64_t i = 0; i < C * in; i++) teacher[i] = sg_rng_normal(&r);
    int64_t kept = 0;
    for (int64_t g = 0; g < nb * Bg; g++) {
        for (int64_t k = 0; k < in; k++) row[k] = (float)sg_rng_normal(&r);
        if ((g % Bg) / b != m->shard) continue;
        memcpy(x + kept * in, row, (size_t)in * sizeof *row);
        int best = 0;
        double best_v = -1e300;
        for (int64_t c = 0; c < C; c++) {
            double s = 0;
            for (int64_t k = 0; k < in; k++) s += teacher[c * in + k] * row[k];
            if (s > best_v) best_v = s, best = (int)c;
        }
        y[kept++] = best;
    }
    SG_ASSERT(kept == rows);
    sg_status st = sg_tensor_copy_from_host(m->data_x, x, (size_t)n * sizeof *x);
    if (st == SG_OK) st = sg_tensor_copy_from_host(m->data_y, y, (size_t)rows * sizeof *y);
    if (st == SG_OK) st = sg_ctx_sync(m->ctx);
    free(x), free(y), free(teacher), free(row);
    return st;
}
