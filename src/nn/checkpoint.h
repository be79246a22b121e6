/* checkpoint.h: named tensors to and from files in the safetensors format (the format of the
 * Hugging Face `safetensors` package), so a checkpoint opens in PyTorch, NumPy or JAX as it is.
 * Used by training to save and resume: parameters, optimizer state, step metadata.
 *
 * Layout (written from the public specification):
 *   8 bytes   N, the header length, u64 little-endian
 *   N bytes   UTF-8 JSON: {"__metadata__": {"key": "value", ...},
 *                          "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [b, e]}, ...}
 *             padded with spaces so that the data starts at a multiple of 8
 *   the rest  raw little-endian tensor bytes; [b, e) is relative to the start of this section,
 *             tensors are contiguous, in offset order, with no gap, overlap or trailing byte.
 * The saver writes what the reference implementation (safetensors 0.8) writes, byte for byte:
 * compact JSON, "__metadata__" first (only when there are pairs, in the caller's order), then
 * the tensors in the reference's order: F64, F32, I32, BF16, by name (bytewise) within a
 * dtype. Larger elements first keeps every tensor aligned to its element size. */
#ifndef SG_NN_CHECKPOINT_H
#define SG_NN_CHECKPOINT_H

#include "core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One named tensor. Names are UTF-8, unique within a file, and not "__metadata__". */
typedef struct sg_ckpt_entry {
    const char *name;
    sg_tensor *t;
} sg_ckpt_entry;

/* Writes the n tensors (read back with sg_tensor_copy_to_host: a host sync, so not during
 * capture) and the metadata pairs meta_kv = {key, value, key, value, ..., NULL} (may be NULL)
 * to path, atomically: into "<file>.tmp.<pid>" beside the file, flushed and fsynced, then
 * renamed over it. First path is checked as sg_checkpoint_check_path (stepgraph.h) checks it:
 * not empty, in an existing writable directory, absent or a regular file; a symbolic link is
 * written through (the file it names is replaced, the link stays), a dangling one refused.
 * Temporaries of the same file left by processes that no longer exist ("<file>.tmp.<digits>"
 * whose pid is gone, or is this process's) are removed before writing. An existing file keeps
 * its permission bits (and, when run as root, its owner); a new one gets 0666 & ~umask.
 * On any failure the temporary is removed and an existing file at path is left as it was.
 * SG_ERR_IO (naming the path and the system's reason, or what the path is) for the target and
 * I/O; SG_ERR_INVALID for an empty path, bad names, or a floating tensor holding NaN or Inf
 * (named, with the first such element): a non-finite checkpoint is never written. */
sg_status sg_checkpoint_save(sg_ctx *ctx, const char *path, const sg_ckpt_entry *e, int n,
                             const char *const *meta_kv);

/* Reads path into the caller's n tensors, matched by name. The file is opened without
 * blocking and refused (SG_ERR_IO) unless it is a regular file: a FIFO, a device, a directory
 * or a socket is never read. The whole file is read and validated first; no tensor is written
 * unless every check passes. The header is parsed in n log n of its size. Errors name the
 * file and, where there is one, the tensor:
 *   SG_ERR_IO       the file cannot be opened or read, or is not a regular file;
 *   SG_ERR_INVALID  the file is corrupt (too short, truncated, header length past the end, not
 *                   the strict JSON the format allows, offsets that overlap, leave gaps, run
 *                   past the end or disagree with dtype and shape), a tensor the caller asks
 *                   for is missing, the file holds a tensor the caller did not ask for
 *                   (extra tensors are an error: a resume must restore the whole state), or a
 *                   floating tensor (F32, BF16, F64) holds NaN or Inf (the message names the
 *                   tensor and the first such element);
 *   SG_ERR_DTYPE / SG_ERR_SHAPE  a tensor's dtype / shape differs from the caller's tensor.
 * meta_json_out (may be NULL): the "__metadata__" object as JSON text ("{}" when absent),
 * NUL-terminated; SG_ERR_INVALID, before any tensor is written, if it needs more than meta_cap
 * bytes. Read one value with sg_checkpoint_meta_get. Any file may be given: this is the entry
 * point the safetensors fuzz target drives. */
sg_status sg_checkpoint_load(sg_ctx *ctx, const char *path, const sg_ckpt_entry *e, int n,
                             char *meta_json_out, size_t meta_cap);

/* Checks a file's metadata (the "__metadata__" object as JSON text, "{}" when absent) during
 * a load, after the header is parsed and before the tensors are matched to the caller's (so
 * its message, naming what differs between the runs, comes first) or any is written: SG_OK lets the load go
 * on; any other status (set with sg_fail, naming path) stops it with nothing written. */
typedef sg_status (*sg_ckpt_meta_check)(sg_ctx *ctx, const char *path, const char *meta_json,
                                        void *user);

/* sg_checkpoint_load with check (may be NULL) called on the metadata before anything is
 * written, so that a caller's metadata is validated as strictly as the tensors. */
sg_status sg_checkpoint_load_ex(sg_ctx *ctx, const char *path, const sg_ckpt_entry *e, int n,
                                char *meta_json_out, size_t meta_cap, sg_ckpt_meta_check check,
                                void *user);

/* The value of key in a metadata object (as sg_checkpoint_load returns it), unescaped, into
 * out (cap bytes, NUL-terminated). No context, so no message: SG_ERR_NULL for a NULL
 * argument; SG_ERR_INVALID when the key is absent, the text is not an object of strings, or
 * the value needs more than cap bytes (out is then ""). */
sg_status sg_checkpoint_meta_get(const char *meta_json, const char *key, char *out, size_t cap);

#ifdef __cplusplus
}
#endif
#endif /* SG_NN_CHECKPOINT_H */
