/* accum_cpu.c: the reference of y = beta * y + alpha * x (accum.h), in the kernel's f32
 * rounding: each product rounded to f32, then their sum. Computed in double and rounded: a
 * product of two floats is exact in double, and a double sum of two floats rounded to float is
 * the correctly rounded f32 sum (double has more than 2 * 24 + 2 bits), so this is the f32
 * arithmetic the kernel does, whatever the host's contraction rules. */
#include "ops/accum.h"

void sg_accumulate_cpu(sg_tensor *y, float beta, const sg_tensor *x, float alpha)
{
    for (int64_t i = 0; i < y->numel; i++) {
        float p = (float)((double)alpha * sg_ld(x, i));
        float q = beta == 0.f ? 0.f : (float)((double)beta * sg_ld(y, i));
        sg_st(y, i, (float)((double)q + (double)p));
    }
}
