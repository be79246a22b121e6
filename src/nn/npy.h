/* npy.h: a strict reader of NumPy's .npy files (format versions 1.0, 2.0 and 3.0) into host
 * memory, for data sets a user saved with np.save: little-endian float32 and int32 as they are,
 * and smaller or wider integers converted to I32 (int64 and uint32 range-checked). C order
 * only, up to SG_MAX_DIMS dimensions, and the data exactly as large as the shape says. Every
 * refusal names the file, the byte offset and what was expected. */
#ifndef SG_NN_NPY_H
#define SG_NN_NPY_H

#include "core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* An array read from a .npy file. */
typedef struct sg_npy {
    sg_dtype dtype;              /* SG_DTYPE_F32 or SG_DTYPE_I32: the values in data */
    char descr[16];              /* the file's dtype, e.g. "<f4", "|u1", "<i8" */
    int major, minor;            /* the format version: 1.0, 2.0 or 3.0 */
    int ndim;                    /* 0 (a scalar: one element) to SG_MAX_DIMS */
    int64_t shape[SG_MAX_DIMS];
    int64_t numel;               /* the product of the shape (1 for a scalar) */
    int64_t data_offset;         /* byte offset of the data in the file */
    void *data;                  /* numel elements of dtype, host memory (malloc) */
    size_t nbytes;               /* numel * 4 */
} sg_npy;

/* Reads path into *out (zeroed first; sg_npy_free releases it). The dtypes taken: '<f4' (F32)
 * and '<i4' (I32) as they are; '|u1', '|i1', '<u2', '<i2' converted to I32 (every value fits);
 * '<u4' and '<i8' converted to I32, a value outside int32 refused with its index and offset.
 * SG_ERR_INVALID, naming the file and the byte offset, for: a bad magic string, a version
 * other than 1.0, 2.0 or 3.0, a header length past the end of the file, a header that is not
 * exactly the dict {'descr': str, 'fortran_order': bool, 'shape': tuple of ints} (each key
 * once, no other key; Python literal syntax, trailing commas allowed) padded with spaces and
 * ended by a newline, a big-endian or unknown dtype, fortran_order True, more than
 * SG_MAX_DIMS dimensions, a negative dimension or a shape whose size overflows, data shorter
 * (truncated) or longer (trailing bytes) than the shape, and for anything but a regular file
 * (a FIFO, a device, a directory: refused before a byte is read). SG_ERR_IO when the file
 * cannot be opened or read; SG_ERR_OOM when the host has no memory for the data. The header
 * need not be padded to a multiple of 64 bytes (NumPy writes it so, and reads it either way). */
sg_status sg_npy_read(sg_ctx *ctx, const char *path, sg_npy *out);
void sg_npy_free(sg_npy *a);

#ifdef __cplusplus
}
#endif
#endif /* SG_NN_NPY_H */
