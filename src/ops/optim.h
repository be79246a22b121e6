/* optim.h: the optimizer steps (AdamW, SGD with momentum) over one flat parameter buffer cut
 * into segments: CPU references (optim_cpu.c), the multi-tensor CUDA kernel (optim_cuda.cu),
 * and the public entry points (optim.c). Hyperparameters are read from device memory, and so
 * is the mixed-precision `skip` flag (sg_amp_unscale's found: a step with non-finite gradients
 * changes nothing). param_lo, when given, receives bf16(param) in the same pass: the compute
 * copy of mixed precision, rounded to nearest even. */
#ifndef SG_OPS_OPTIM_H
#define SG_OPS_OPTIM_H

#include "core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element indices of sg_optim_hparams inside the hp tensor (8 floats). */
enum {
    SG_HP_LR = 0,
    SG_HP_BETA1,
    SG_HP_BETA2,
    SG_HP_EPS,
    SG_HP_WEIGHT_DECAY,
    SG_HP_MOMENTUM,
    SG_HP_DAMPENING,
    SG_HP_STEP,
    SG_HP_COUNT
};

/* Bytes of sg_ctx_scratch(ctx, SG_SLOT_OPTIM, ...) the CUDA step uses: its "last block done"
 * counter. The first step of a context allocates and zero-fills it (one extra launch); an
 * optimizer reserves it up front with this size so that steps (and captures) allocate
 * nothing and the address stays put. Always ask for exactly this size. */
#define SG_OPTIM_SCRATCH_BYTES 16

/* References, in double through sg_ld/sg_st (f32 or f64 tensors; hp f32 or f64). The
 * arguments are valid (optim.c checks them). m, v, buf: (P), like param. skip (1 I32) or
 * NULL: read when the work runs; nonzero returns at once, nothing written. param_lo (P BF16)
 * or NULL: bf16 of each new param as stored (sg_double_to_bf16: round to nearest even). */
void sg_adamw_step_cpu(sg_tensor *param, const sg_tensor *grad, sg_tensor *m, sg_tensor *v,
                       sg_tensor *hp, const sg_tensor *seg_start, const sg_tensor *seg_decay,
                       int n_seg, const sg_tensor *skip, sg_tensor *param_lo);
void sg_sgd_step_cpu(sg_tensor *param, const sg_tensor *grad, sg_tensor *buf, sg_tensor *hp,
                     const sg_tensor *seg_start, const sg_tensor *seg_decay, int n_seg,
                     const sg_tensor *skip, sg_tensor *param_lo);

/* One launch each, f32; seg_start/seg_decay/skip are device tensors (skip read by the kernel:
 * on nonzero every block returns at entry, so neither the buffers nor hp.step nor the block
 * counter move). */
sg_status sg_adamw_step_cuda(sg_ctx *ctx, sg_tensor *param, const sg_tensor *grad, sg_tensor *m,
                             sg_tensor *v, sg_tensor *hp, const sg_tensor *seg_start,
                             const sg_tensor *seg_decay, int n_seg, const sg_tensor *skip,
                             sg_tensor *param_lo);
sg_status sg_sgd_step_cuda(sg_ctx *ctx, sg_tensor *param, const sg_tensor *grad, sg_tensor *buf,
                           sg_tensor *hp, const sg_tensor *seg_start, const sg_tensor *seg_decay,
                           int n_seg, const sg_tensor *skip, sg_tensor *param_lo);

#ifdef __cplusplus
}
#endif
#endif
