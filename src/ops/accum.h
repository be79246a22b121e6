/* accum.h: the sum of gradient accumulation, y = beta * y + alpha * x over flat buffers (y f32,
 * x f32 or bf16): the trainer adds each micro-batch's gradients (and loss) into the step's f32
 * sum with it. The CPU reference (accum_cpu.c), the CUDA kernel (accum_cuda.cu) and the entry
 * point that checks the arguments (accum.c).
 *
 * Rounding, the same on both backends, so that they agree bit for bit: p = f32(alpha * x) and
 * q = f32(beta * y) are each rounded once to f32, then y = f32(q + p); no fused multiply-add.
 * beta == 0 writes y without reading it (an uninitialised or NaN y does not leak in), as BLAS
 * does. With alpha = beta = 1 (the gradients' case) it is exactly the f32 sum y + x. */
#ifndef SG_OPS_ACCUM_H
#define SG_OPS_ACCUM_H

#include "core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y (n) F32 = beta * y + alpha * x (n) F32 or BF16 (x read exactly); any shapes of n
 * elements, read as flat; y and x must not overlap. One launch on CUDA; capturable. */
sg_status sg_accumulate(sg_ctx *ctx, sg_tensor *y, float beta, const sg_tensor *x, float alpha);

/* The reference, arguments already checked (x may be f64 too on the CPU). */
void sg_accumulate_cpu(sg_tensor *y, float beta, const sg_tensor *x, float alpha);

/* One grid-stride launch, 16-byte accesses where the buffers allow. */
sg_status sg_accumulate_cuda(sg_ctx *ctx, sg_tensor *y, float beta, const sg_tensor *x, float alpha);

#ifdef __cplusplus
}
#endif
#endif
