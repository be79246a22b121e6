/* data.c: the synthetic data set. Inputs are N(0,1); labels are the argmax of a fixed random
 * linear teacher, so the task is learnable and a falling loss proves learning. Generated on
 * the host from a seed (the same on every backend), uploaded once. */
#include "models/model.h"

#include <stdlib.h>

sg_status sg_data_teacher(sg_model *m, uint64_t seed)
{
    int64_t n = m->data_x->numel, rows = m->data_y->numel, in = m->in_dim, C = m->classes;
    float *x = malloc((size_t)n * sizeof *x);
    int32_t *y = malloc((size_t)rows * sizeof *y);
    double *teacher = malloc((size_t)(C * in) * sizeof *teacher);
    if (!x || !y || !teacher) {
        free(x), free(y), free(teacher);
        return sg_fail(m->ctx, SG_ERR_OOM, "sg_model_create: out of host memory for the data set");
    }
    sg_rng r = {seed};
    for (int64_t i = 0; i < C * in; i++) teacher[i] = sg_rng_normal(&r);
    for (int64_t i = 0; i < n; i++) x[i] = (float)sg_rng_normal(&r);
    for (int64_t row = 0; row < rows; row++) {
        const float *xr = x + row * in;
        int best = 0;
        double best_v = -1e300;
        for (int64_t c = 0; c < C; c++) {
            double s = 0;
            for (int64_t k = 0; k < in; k++) s += teacher[c * in + k] * xr[k];
            if (s > best_v) best_v = s, best = (int)c;
        }
        y[row] = best;
    }
    sg_status st = sg_tensor_copy_from_host(m->data_x, x, (size_t)n * sizeof *x);
    if (st == SG_OK) st = sg_tensor_copy_from_host(m->data_y, y, (size_t)rows * sizeof *y);
    if (st == SG_OK) st = sg_ctx_sync(m->ctx);
    free(x), free(y), free(teacher);
    return st;
}
