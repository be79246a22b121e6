/* decode.h: the ops of KV-cache generation (inference only: nothing here has a backward). The
 * attention of new rows against a per-layer key/value cache, the embedding of one token per
 * sequence at its own position, the gather of each prompt's last row, and the sampler that
 * draws the next token on the device and keeps every sequence's state there, so a captured
 * decode step (or a WHILE loop of them) needs no host; and one row through a linear layer with
 * its LayerNorm and residual fused, a batch-1 step's. CPU references in decode_cpu.c, kernels
 * in decode_cuda.cu (the fused row's beside sg_linear_forward's GEMV, in linear_cuda.cu), entry
 * points that check the arguments in decode.c.
 *
 * The cache of one layer: kcache and vcache (Bc, H, Tc, hs), qkv's dtype; row (b, h, t) holds
 * the key (value) of head h of sequence b at position t.
 *
 * sg_kv_attention: qkv (B*Tq, 3C) holds Tq new rows of each of B sequences (q | k | v side by
 * side, head h in columns h*hs..h*hs+hs-1 of each, as sg_attention_forward reads them); start
 * (B) I32 gives the position of each sequence's first new row, so row (b, i) sits at
 * p = start[b] + i. Each row stores its k and v at cache position p and attends, causally, to
 * positions 0..p: those below start[b] read from the cache (written by earlier calls), the
 * others from qkv itself. out (B*Tq, C) is the attention output in the layout the projection
 * reads. A prefill is Tq = the padded prompt length with start 0; a decode step is Tq = 1 with
 * start = each sequence's position. Rows whose p falls outside 0..Tc-1 store nothing and
 * output zeros. Math: scores, softmax and the weighted sum in f32 on the GPU (double on the
 * CPU), outputs rounded once to the dtype. Deterministic: fixed-order sums, no atomics. On CUDA
 * (sm_90) it is launched as sg_gen_row_linear is (below) and reads start, and asks L2 for the
 * cached rows below start, before it waits: those must not be written by kernels that may still
 * run (in generation, earlier steps wrote them).
 *
 * Generation state (the sampler's): tok (B) I32, the token each sequence feeds next; pos (B)
 * I32, its position; info (B, SG_GEN_INFO) I32 per sequence (prompt length, new tokens
 * allowed, new tokens so far, why it finished); out (B, N) I32, the new tokens; ctl
 * (SG_GEN_CTL) I32, shared: the WHILE condition, the sampler's block counter, top-k, the stop
 * sequence and the seed; temp (1) F32, the temperature. Every value the host sets lives in
 * device memory, so one captured graph serves any prompt, temperature, seed or stop sequence. */
#ifndef SG_OPS_DECODE_H
#define SG_OPS_DECODE_H

#include "core/core.h"
#include "ops/dropout.h" /* Philox */

#ifdef __cplusplus
extern "C" {
#endif

/* info's fields, per sequence. */
enum { SG_GEN_PLEN = 0, SG_GEN_MAXNEW, SG_GEN_LEN, SG_GEN_DONE, SG_GEN_INFO };
/* Why a sequence finished (info[SG_GEN_DONE]); 0 while it runs. */
enum { SG_GEN_RUNNING = 0, SG_GEN_DONE_LENGTH = 1, SG_GEN_DONE_STOP = 2 };
/* The longest stop sequence, in tokens. */
#define SG_GEN_MAX_STOP 16
/* ctl's elements. GO: some sequence runs (the WHILE's condition); COUNT: the CUDA sampler's
 * count of finished blocks (0 between launches); TOPK: 0 or >= V keeps every token; NSTOP,
 * STOP..: the stop sequence; SEED_LO, SEED_HI: the sampler's key. */
enum {
    SG_GEN_GO = 0,
    SG_GEN_COUNT,
    SG_GEN_TOPK,
    SG_GEN_NSTOP,
    SG_GEN_SEED_LO,
    SG_GEN_SEED_HI,
    SG_GEN_STOP,
    SG_GEN_CTL = SG_GEN_STOP + SG_GEN_MAX_STOP
};
/* The Philox site of the sampler (dropout's sites are small numbers from the builder). */
#define SG_GEN_SITE 0x5a3d1e00u

/* The uniform draw of sequence b's n-th new token under seed (lo, hi): word 0 of
 * Philox4x32-10(counter {n, b, SG_GEN_SITE, 0}, key {lo, hi}), as (word >> 8) * 2^-24, in
 * [0, 1). The same on both backends, whatever the batch or the mode. */
SG_PHILOX_FN float sg_gen_uniform(uint32_t seed_lo, uint32_t seed_hi, uint32_t b, uint32_t n)
{
    return sg_philox_uniform(sg_philox4x32_10(n, b, SG_GEN_SITE, 0, seed_lo, seed_hi).v[0]);
}

/* Float bits ordered as the floats (for top-k's threshold search): larger float, larger key. */
SG_PHILOX_FN uint32_t sg_gen_order_key(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* ---- entry points (decode.c): argument checks, then the reference or the kernel ---- */

/* As described at the top; kcache and vcache are one layer's. qkv, kcache, vcache and out
 * share one dtype (f32, bf16; f64 on the CPU); Bc >= B; Tc <= SG_KV_MAX_T (the scores of a row
 * sit in shared memory); head size C / heads <= SG_KV_MAX_HS (a head's columns are one pass of
 * the block's threads). */
#define SG_KV_MAX_T 8192
#define SG_KV_MAX_HS 128
sg_status sg_kv_attention(sg_ctx *ctx, const sg_tensor *qkv, int heads, const sg_tensor *start,
                          sg_tensor *kcache, sg_tensor *vcache, sg_tensor *out);
/* y (B, C) = wte[tok[b]] + wpe[pos[b]]: one token per sequence at its own position. A token or
 * position out of range is an error on the CPU (checked when the work runs) and a zero row on
 * CUDA (the values never reach the host). */
sg_status sg_embed_at(sg_ctx *ctx, const sg_tensor *tok, const sg_tensor *pos, const sg_tensor *wte,
                      const sg_tensor *wpe, sg_tensor *y);
/* y (B, C) = x[b*Tp + info[b].PLEN - 1] for x (B*Tp, C): each prompt's last row (the one that
 * predicts the first new token); a PLEN outside 1..Tp gives a zero row (CPU: an error). */
sg_status sg_gen_last_rows(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *info, sg_tensor *y);
/* A generation's start: for each sequence LEN = 0, DONE = (MAXNEW <= 0 ? LENGTH : RUNNING),
 * tok = 0 and pos = PLEN - 1 (so that a sequence finished from the start, a batch bucket's
 * padding, still feeds a valid token at a valid position to the steps that mask it); ctl[COUNT]
 * = 0, ctl[GO] = 0. */
sg_status sg_gen_begin(sg_ctx *ctx, sg_tensor *tok, sg_tensor *pos, sg_tensor *info, sg_tensor *ctl);
/* Draws each running sequence's next token from logits (B, V) (f32 or bf16):
 *   - temperature <= 0 (or top-k 1): the largest logit, the lowest index on a tie;
 *   - else: the tokens whose logits are among the top-k (all of them when top-k is 0 or >= V;
 *     ties at the k-th value all kept), weights exp((l - max) / temperature) in f32, and the
 *     first token whose running sum exceeds u * (the sum), u = sg_gen_uniform(seed, b, LEN).
 * Then out[b][LEN] = token, LEN += 1, tok[b] = token, pos[b] = PLEN + LEN - 1 (where it is fed
 * next), DONE = LENGTH when LEN >= MAXNEW, else STOP when the last NSTOP new tokens are the stop
 * sequence. A finished sequence is left as it is. Last, ctl[GO] = some sequence of the B runs.
 * out (Bo, N) with Bo >= B and N >= every MAXNEW. */
sg_status sg_gen_sample(sg_ctx *ctx, const sg_tensor *logits, sg_tensor *tok, sg_tensor *pos, sg_tensor *info,
                        sg_tensor *out, sg_tensor *ctl, const sg_tensor *temp);
/* One row through a linear layer with what surrounds it in a decode step, in one kernel on the
 * GPU (a batch-1 step is ~60 such small launches, so every launch saved counts):
 *   y (1, N) = act(norm(x) W^T + b) + r
 * x (1, K); w (N, K); b (N) or NULL; norm(x) = LayerNorm(x; gamma, beta, eps), rounded to x's
 * dtype as sg_layernorm_forward stores it, when gamma (K) and beta (K) are given, else x; act
 * NONE, RELU or GELU (no pre kept: inference only); r (1, N) or NULL; y may be r (the residual
 * updated in place) but shares no byte with the others. One dtype throughout (f32, bf16; f64 on
 * the CPU). With the LayerNorm a row is at most 48 KiB on CUDA.
 * On CUDA (sm_90) the kernel is launched with programmatic dependent launch and lets the next
 * kernel start early too: it loads part of w, and asks L2 for the rest, before it waits for the
 * kernels before it, which may still run (every kernel since the last one launched without it),
 * so w must not be written by any of those; a decode step's weights are written by none. */
sg_status sg_gen_row_linear(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *gamma, const sg_tensor *beta,
                            float eps, const sg_tensor *w, const sg_tensor *b, sg_activation act,
                            const sg_tensor *r, sg_tensor *y);

/* ---- references (decode_cpu.c) and kernels (decode_cuda.cu): arguments checked ---- */

void sg_kv_attention_cpu(const sg_tensor *qkv, int heads, const sg_tensor *start, sg_tensor *kcache,
                         sg_tensor *vcache, sg_tensor *out);
void sg_embed_at_cpu(const sg_tensor *tok, const sg_tensor *pos, const sg_tensor *wte, const sg_tensor *wpe,
                     sg_tensor *y);
void sg_gen_last_rows_cpu(const sg_tensor *x, const sg_tensor *info, sg_tensor *y);
void sg_gen_begin_cpu(sg_tensor *tok, sg_tensor *pos, sg_tensor *info, sg_tensor *ctl);
/* work: V floats of scratch. */
void sg_gen_sample_cpu(const sg_tensor *logits, sg_tensor *tok, sg_tensor *pos, sg_tensor *info,
                       sg_tensor *out, sg_tensor *ctl, float temperature, float *work);
/* work: K doubles of scratch. */
void sg_gen_row_linear_cpu(const sg_tensor *x, const sg_tensor *gamma, const sg_tensor *beta, float eps,
                           const sg_tensor *w, const sg_tensor *b, sg_activation act, const sg_tensor *r,
                           sg_tensor *y, double *work);

sg_status sg_kv_attention_cuda(sg_ctx *ctx, const sg_tensor *qkv, int heads, const sg_tensor *start,
                               sg_tensor *kcache, sg_tensor *vcache, sg_tensor *out);
sg_status sg_embed_at_cuda(sg_ctx *ctx, const sg_tensor *tok, const sg_tensor *pos, const sg_tensor *wte,
                           const sg_tensor *wpe, sg_tensor *y);
sg_status sg_gen_last_rows_cuda(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *info, sg_tensor *y);
sg_status sg_gen_begin_cuda(sg_ctx *ctx, sg_tensor *tok, sg_tensor *pos, sg_tensor *info, sg_tensor *ctl);
sg_status sg_gen_sample_cuda(sg_ctx *ctx, const sg_tensor *logits, sg_tensor *tok, sg_tensor *pos,
                             sg_tensor *info, sg_tensor *out, sg_tensor *ctl, const sg_tensor *temp);
/* In linear_cuda.cu: the one-row GEMV kernel of sg_linear_forward, with the LayerNorm and the
 * residual in it. */
sg_status sg_gen_row_linear_cuda(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *gamma, const sg_tensor *beta,
                                 float eps, const sg_tensor *w, const sg_tensor *b, sg_activation act,
                                 const sg_tensor *r, sg_tensor *y);

#ifdef __cplusplus
}
#endif
#endif
