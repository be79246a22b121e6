/* act_cpu.c: reference ReLU, GELU (tanh), SiLU, sigmoid and residual add, forward and
 * backward, computed in double for every dtype through sg_ld/sg_st (bf16 outputs are rounded
 * only on the store). These are the oracle the CUDA kernels are tested against. */
#include "ops/act.h"

#include <math.h>

void sg_relu_forward_cpu(const sg_tensor *x, sg_tensor *y)
{
    for (int64_t i = 0; i < x->numel; i++) {
        double v = sg_ld(x, i);
        sg_st(y, i, v > 0 ? v : 0);
    }
}

void sg_relu_backward_cpu(const sg_tensor *x, const sg_tensor *dy, sg_tensor *dx)
{
    for (int64_t i = 0; i < x->numel; i++) sg_st(dx, i, sg_ld(x, i) > 0 ? sg_ld(dy, i) : 0);
}

void sg_gelu_forward_cpu(const sg_tensor *x, sg_tensor *y)
{
    for (int64_t i = 0; i < x->numel; i++) {
        double v = sg_ld(x, i);
        double u = SG_GELU_K0 * (v + SG_GELU_K1 * v * v * v);
        sg_st(y, i, 0.5 * v * (1 + tanh(u)));
    }
}

/* d/dx 0.5 x (1 + tanh u) = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) du/dx */
void sg_gelu_backward_cpu(const sg_tensor *x, const sg_tensor *dy, sg_tensor *dx)
{
    for (int64_t i = 0; i < x->numel; i++) {
        double v = sg_ld(x, i);
        double u = SG_GELU_K0 * (v + SG_GELU_K1 * v * v * v);
        double t = tanh(u);
        double du = SG_GELU_K0 * (1 + 3 * SG_GELU_K1 * v * v);
        sg_st(dx, i, sg_ld(dy, i) * (0.5 * (1 + t) + 0.5 * v * (1 - t * t) * du));
    }
}

void sg_add_forward_cpu(const sg_tensor *a, const sg_tensor *b, sg_tensor *y)
{
    for (int64_t i = 0; i < a->numel; i++) sg_st(y, i, sg_ld(a, i) + sg_ld(b, i));
}

/* 1 / (1 + e^-v): e^-v overflows to inf for v < -709, giving 0 as it should. */
static double sigmoid(double v)
{
    return 1.0 / (1.0 + exp(-v));
}

void sg_silu_forward_cpu(const sg_tensor *x, sg_tensor *y)
{
    for (int64_t i = 0; i < x->numel; i++) {
        double v = sg_ld(x, i);
        sg_st(y, i, v * sigmoid(v));
    }
}

/* d/dx x s(x) = s + x s (1 - s) */
void sg_silu_backward_cpu(const sg_tensor *x, const sg_tensor *dy, sg_tensor *dx)
{
    for (int64_t i = 0; i < x->numel; i++) {
        double v = sg_ld(x, i), s = sigmoid(v);
        sg_st(dx, i, sg_ld(dy, i) * (s + v * s * (1 - s)));
    }
}

void sg_sigmoid_forward_cpu(const sg_tensor *x, sg_tensor *y)
{
    for (int64_t i = 0; i < x->numel; i++) sg_st(y, i, sigmoid(sg_ld(x, i)));
}

void sg_sigmoid_backward_cpu(const sg_tensor *y, const sg_tensor *dy, sg_tensor *dx)
{
    for (int64_t i = 0; i < y->numel; i++) {
        double s = sg_ld(y, i);
        sg_st(dx, i, sg_ld(dy, i) * s * (1 - s));
    }
}
