/* gpt.c: gpt-WIDTH-DEPTH-BATCH-SEQ, a decoder-only transformer over bytes (vocabulary 256) or
 * the tokens of a token file (vocabulary V, sg_model_options.vocab): token + position
 * embedding, DEPTH pre-LayerNorm GPT-2 blocks (causal self-attention with heads = WIDTH/64,
 * then a 4x GELU MLP, each added back to the residual stream, with optional dropout after
 * each), a final LayerNorm and a linear head (not tied to the embedding), trained with the
 * fused softmax cross-entropy on the next token. Made from the public builder and modules
 * only (sg_module_embedding, sg_module_gpt_block, ...), as a user's model would be. */
#include "models/model.h"

#include <math.h>
#include <stdio.h>

#define GPT_BYTE_VOCAB 256
#define GPT_HEAD_DIM 64

/* Mirrors sg_gpt_build's allocations: parameters and gradients (and their bf16 copies), the
 * embedding's, each block's, the shared backward scratch's, ln_f's and the head's buffers,
 * and the inputs; the embedding, the head and the logits grow with the vocabulary. The text
 * data set is counted when it is read (sg_text_open_ex). */
void sg_gpt_estimate(const sg_kind_spec *s, sg_dtype precision, float dropout, int64_t vocab,
                     sg_model_size *out)
{
    double C = (double)s->width, L = (double)s->depth, B = (double)s->batch, T = (double)s->seq;
    double M = B * T, V = (double)(vocab > 0 ? vocab : GPT_BYTE_VOCAB), H = floor(C / GPT_HEAD_DIM), a = precision == SG_DTYPE_BF16 ? 2 : 4;
    double drop = dropout > 0 ? 1 : 0;
    double P = 2 * V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C;
    out->params = (int64_t)P;
    out->param_bytes = (size_t)(2 * P * 4 + (a == 2 ? 2 * P * 2 : 0));
    out->optim_bytes = (size_t)(2 * P * 4);
    double embed = (1 + 2 * drop) * M * C * a;
    /* The attention's work and saved probabilities, or (fused) its delta and log-sum-exps. */
    int fused = sg_module_attention_fused(precision, s->width, (int)H);
    double work = fused ? B * H * T * 4 : (4 * M * C + B * H * T * T) * 4, saved = fused ? B * H * T * 4 : B * H * T * T * a;
    /* The blocks' shared backward scratch: d.fc (4 MC), d.qkv (3), d.h2, d.x2, d.attn, d.h1, and
     * dx, which alternates between two buffers from the second block on. */
    double shared = work + (4 + 3 + 4 + fmin(L, 2) + 2 * drop) * M * C * a;
    /* A block's own: h1, x2, h2, qkv (3), attn, proj, fc and fc.pre (4 each), y; with dropout
     * proj.dropped, mlp.proj and mlp.proj.dropped (without it the MLP's projection writes y
     * itself); the LayerNorms' means and rstds. */
    double block = (17 + 3 * drop) * M * C * a + 4 * M * 4 + saved;
    double tail = 2 * M * C * a + 2 * M * 4 + M * V * a + M * C * a + M * V * a;
    /* Recompute: one block's buffers in the arena, each block's output copied out of it, and
     * the two input-gradient buffers the wrappers share. */
    double blocks = s->recompute ? block + L * M * C * a + 2 * M * C * a : L * block;
    out->activation_bytes = (size_t)(embed + shared + blocks + tail);
    out->data_bytes = (size_t)(2 * M * 4);
}

sg_status sg_gpt_build(sg_ctx *ctx, const char *name, const sg_kind_spec *s, const sg_model_options *o,
                       uint64_t seed, sg_model **out)
{
    int64_t C = s->width, L = s->depth, T = s->seq, H = C / GPT_HEAD_DIM;
    int64_t vocab = o ? o->vocab : 0, V = vocab > 0 ? vocab : GPT_BYTE_VOCAB;
    if (C % GPT_HEAD_DIM || H < 1)
        return sg_ctx_fail(ctx, SG_ERR_INVALID, "sg_model_create: '%s': width %lld is not a multiple of the "
                              "head size %d", name, (long long)C, GPT_HEAD_DIM);
    if (vocab < 0 || vocab > INT32_MAX)
        return sg_ctx_fail(ctx, SG_ERR_INVALID, "sg_model_create: '%s': vocab %lld: expected 0 (bytes) or 1 to "
                              "%d", name, (long long)vocab, INT32_MAX);
    const char *data = o && o->data_path && o->data_path[0] ? o->data_path : NULL;
    if (vocab > 0 && !data)
        return sg_ctx_fail(ctx, SG_ERR_INVALID, "sg_model_create: '%s' with vocab %lld reads a token file: give "
                              "data_path (--data)", name, (long long)vocab);
    /* The data first: a bad file is refused before the model is allocated. */
    sg_dataset *d = NULL;
    SG_KIND_TRY(sg_dataset_from_text(ctx, data, o ? o->val_data_path : NULL, vocab, T, &d));
    sg_builder_options bo = sg_kind_builder_options(o, s->batch);
    bo.seq = T;
    bo.dropout = o ? o->dropout : 0.f;
    sg_builder *b = NULL;
    sg_status st = sg_builder_create(ctx, name, &bo, &b);
    if (st != SG_OK) {
        sg_dataset_destroy(d);
        return st;
    }
    /* Parameters are declared in this order (the checkpoint's): wte, wpe, the blocks, ln_f,
     * head. The embedding's empty name gives GPT-2's "wte.weight". */
    sg_module *mods[64 + 3];
    int k = 0;
    st = sg_module_embedding(b, "", V, C, &mods[k]);
    if (st == SG_OK) k++;
    for (int l = 0; l < L && st == SG_OK; l++) {
        char n[32];
        snprintf(n, sizeof n, "blocks.%d", l);
        int rc = o && o->recompute;
        if (rc) st = sg_builder_begin_recompute(b);
        if (st == SG_OK) st = sg_module_gpt_block(b, n, C, (int)H, &mods[k]);
        if (st == SG_OK && rc) st = sg_module_recompute(b, n, mods[k], &mods[k]);
        if (st == SG_OK) k++;
    }
    if (st == SG_OK) st = sg_module_layernorm(b, "ln_f", C, 1e-5f, &mods[k]);
    if (st == SG_OK) k++;
    if (st == SG_OK) st = sg_module_linear_init(b, "head", C, V, 0, SG_ACT_NONE, SG_INIT_NORMAL_002, &mods[k]);
    if (st == SG_OK) k++;
    sg_module *net = NULL;
    if (st == SG_OK) st = sg_module_sequential(b, "gpt", mods, k, &net);
    if (st != SG_OK) {
        sg_builder_destroy(b);
        sg_dataset_destroy(d);
        return st;
    }
    return sg_builder_finish(b, net, SG_LOSS_SOFTMAX_XENT, d, seed, out);
}
