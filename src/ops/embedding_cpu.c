/* embedding_cpu.c: reference token + position embedding, forward and backward, in double for
 * every dtype through sg_ld/sg_st (bf16 outputs are rounded only on the store). The oracle
 * the CUDA kernels are tested against.
 * Shapes: tokens (B, T) with every token in 0..V-1; wte, dwte (V, C); wpe, dwpe (Tmax, C);
 * y, dy (B*T, C) row-major (a (B, T, C) tensor is the same bytes). */
#include "ops/embedding.h"

#include <stdlib.h>

void sg_embedding_forward_cpu(const sg_tensor *tokens, const sg_tensor *wte, const sg_tensor *wpe,
                              sg_tensor *y)
{
    const int32_t *tk = tokens->data;
    const int64_t T = tokens->shape[1], C = wte->shape[1];
    for (int64_t i = 0; i < tokens->numel; i++) {
        const int64_t v = tk[i], t = i % T;
        for (int64_t c = 0; c < C; c++)
            sg_st(y, i * C + c, sg_ld(wte, v * C + c) + sg_ld(wpe, t * C + c));
    }
}

/* dwte[v] = sum over positions i (in order) with tokens[i] == v of dy[i], accumulated in a
 * (V, C) double buffer; dwpe[t] = sum over b (in order) of dy[b, t] for t < T, 0 beyond. */
sg_status sg_embedding_backward_cpu(sg_ctx *ctx, const sg_tensor *tokens, const sg_tensor *dy,
                                    sg_tensor *dwte, sg_tensor *dwpe)
{
    const int32_t *tk = tokens->data;
    const int64_t B = tokens->shape[0], T = tokens->shape[1];
    const int64_t V = dwte->shape[0], C = dwte->shape[1], Tmax = dwpe->shape[0];
    double *acc = calloc((size_t)(V * C), sizeof *acc);
    if (!acc)
        return sg_fail(ctx, SG_ERR_OOM,
                       "sg_embedding_backward: out of host memory for the "
                       "CPU reference's (%lld, %lld) buffer",
                       (long long)V, (long long)C);
    for (int64_t i = 0; i < B * T; i++) {
        double *row = acc + (int64_t)tk[i] * C;
        for (int64_t c = 0; c < C; c++) row[c] += sg_ld(dy, i * C + c);
    }
    for (int64_t k = 0; k < V * C; k++) sg_st(dwte, k, acc[k]);
    free(acc);

    for (int64_t t = 0; t < Tmax; t++)
        for (int64_t c = 0; c < C; c++) {
            double s = 0;
            for (int64_t b = 0; t < T && b < B; b++) s += sg_ld(dy, (b * T + t) * C + c);
            sg_st(dwpe, t * C + c, s);
        }
    return SG_OK;
}
