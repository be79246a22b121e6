/* rmsnorm.h: a module of the user's own, RMSNorm (y = x / rms(x) * weight over the last dim),
 * with its own CUDA kernels (rmsnorm_cuda.cu) and its own CPU reference (rmsnorm.c), plugged
 * into stepgraph through the public sg_module_ops table. Used by custom_module.c (and by
 * stepgraph's own tests, as a user's module). */
#ifndef RMSNORM_H
#define RMSNORM_H

#include "stepgraph.h"

/* x (rows, C) -> y (rows, C); parameter "<name>.weight" (C), ones, no weight decay. On the
 * CUDA backend it needs the kernels (built with RMSNORM_CUDA); without them it refuses. */
sg_status rmsnorm_create(sg_builder *b, const char *name, int64_t C, sg_module **out);

#endif
