/* dataset.h: data sets behind the public sg_dataset: samples resident on the device that a
 * step gathers its batch from by a device-side index (so a captured step loads its own batch),
 * batches fed from a host loader into two device slots through a copy stream, and token text
 * (random windows; text.c). Used by the model object. */
#ifndef SG_NN_DATASET_H
#define SG_NN_DATASET_H

#include "core/core.h"
#include "nn/text.h" /* sg_text_buckets, sg_text_vary_len: the draw shared with the text gather */

#ifdef __cplusplus
extern "C" {
#endif

typedef enum sg_dataset_kind {
    SG_DATASET_SAMPLES = 0,      /* x (n, ...), y (n, ...) on the device */
    SG_DATASET_FED,              /* the same with n = 2 batches, refilled from the host */
    SG_DATASET_TEXT              /* token windows (struct sg_text) */
} sg_dataset_kind;

struct sg_dataset {
    sg_ctx *ctx;
    sg_dataset_kind kind;
    sg_tensor *x, *y;            /* (n, ...): samples (fed: 2 batches of B) */
    int64_t n;                   /* samples */
    int64_t x_row, y_row;        /* elements a sample */
    struct sg_dataset *val;      /* samples: the validation split (sg_dataset_set_validation; NULL: none) */
    /* fed */
    int64_t batch;               /* rows a slot (a fed batch) */
    int64_t slot_batch[2];       /* the batch index each slot holds (-1: none yet) */
    int64_t last_begun;          /* the last batch whose step was queued (-1: none) */
    void *feed;                  /* the CUDA feed state (copy stream, events, pinned staging) */
    /* text */
    struct sg_text *text;
    void (*text_close)(struct sg_text *t);
    bool owned;                  /* handed to a model */
};

/* Copies the rows of batch *idx (device I32) into x_out (rows, x_row) and y_out (rows, y_row):
 * row r is sample (idx*stride + offset + r) mod n. Device work, capturable. */
sg_status sg_dataset_gather(sg_dataset *d, const sg_tensor *idx, int64_t stride, int64_t offset,
                            sg_tensor *x_out, sg_tensor *y_out);
/* The first sample of batch `index` when its rows lie back to back (no wrap): the eager path
 * points views there instead of copying. -1 when they wrap. */
int64_t sg_dataset_contiguous(const sg_dataset *d, int64_t index, int64_t stride, int64_t offset, int64_t rows);
/* Fed data sets, before the work of batch `index` is queued: the stream waits for its copy,
 * and slot (index+1) mod 2 is marked free once the work queued so far (batch index-1's) is
 * done. SG_ERR_INVALID when batch index was not fed. A no-op for other kinds. */
sg_status sg_dataset_step_begin(sg_dataset *d, int64_t index);

/* A variable batch drawn on the device (the trainer's vary_batch): rows = sg_vary_len(*step,
 * the largest bucket), k = the first bucket >= rows, Tb = buckets[k]; rows rows..Tb-1 of x_out
 * (x_row 4-byte elements a row) are zeroed and of y_out (y_row a row) set to y_pad (as y_out's
 * dtype: F32 or I32), what sg_model_load_padded writes; *bucket_out (one I32) = k. x_out and
 * y_out hold at least the largest bucket's rows. buckets: 1..32 increasing from 1. Device
 * work, no host sync, capturable; the bucket list is copied. */
sg_status sg_dataset_pad_vary(sg_ctx *ctx, const sg_tensor *step, const int64_t *buckets, int n_buckets,
                              int64_t x_row, int64_t y_row, sg_tensor *x_out, sg_tensor *y_out, double y_pad,
                              sg_tensor *bucket_out);

#ifdef SG_HAVE_CUDA
sg_status sg_dataset_pad_vary_cuda(sg_ctx *ctx, const int32_t *step, struct sg_text_buckets bk, int64_t x_row,
                                   int64_t y_row, uint32_t *x, uint32_t *y, uint32_t y_pad, int32_t *bucket_out);
sg_status sg_dataset_gather_cuda(sg_dataset *d, const sg_tensor *idx, int64_t stride, int64_t offset,
                                 sg_tensor *x_out, sg_tensor *y_out);
sg_status sg_index_advance_cuda(sg_ctx *ctx, sg_tensor *idx);
sg_status sg_feed_cuda_create(sg_ctx *ctx, size_t x_bytes, size_t y_bytes, void **out);
void sg_feed_cuda_destroy(sg_ctx *ctx, void *feed);
sg_status sg_feed_cuda_copy(sg_ctx *ctx, void *feed, int slot, const void *x, size_t xb, const void *y,
                            size_t yb, void *dst_x, void *dst_y);
sg_status sg_feed_cuda_begin(sg_ctx *ctx, void *feed, int slot, int free_slot);
#endif

#ifdef __cplusplus
}
#endif
#endif
