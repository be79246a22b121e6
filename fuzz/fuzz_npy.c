/* fuzz_npy.c: the .npy reader (src/nn/npy.c) on arbitrary bytes: the input is the file. Seeds
 * in fuzz/corpus/npy/ are files NumPy wrote (every dtype taken, versions 1.0 to 3.0) and a few
 * it refuses; fuzz/npy.dict holds the header's words. Invariants: no crash, leak or UB; a file
 * read holds what its header says (0 to 4 dimensions, their product elements, 4 bytes each of
 * F32 or I32, its data ending at the end of the file); a refusal names the file. */
#include "fuzz.h"

#include "nn/npy.h"

static int item_size(const char *descr)
{
    static const struct { const char *d; int size; } t[] = {{"<f4", 4}, {"<i4", 4}, {"<i8", 8}, {"<u4", 4},
                                                            {"<u2", 2}, {"<i2", 2}, {"|u1", 1}, {"|i1", 1}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(descr, t[i].d)) return t[i].size;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sg_ctx *ctx = fz_ctx();
    const char *path = fz_write_file("in.npy", data, size);
    sg_npy a;
    sg_status st = sg_npy_read(ctx, path, &a);
    fz_say(ctx, "sg_npy_read", st);
    if (st != SG_OK) {
        FZ_CHECK(strstr(sg_ctx_last_error(ctx), path) || st == SG_ERR_OOM, "the message does not name the file: %s",
                 sg_ctx_last_error(ctx));
        FZ_CHECK(a.data == NULL, "data left set after a refusal");
        return 0;
    }
    int64_t numel = 1;
    FZ_CHECK(a.ndim >= 0 && a.ndim <= SG_MAX_DIMS, "ndim %d", a.ndim);
    for (int d = 0; d < a.ndim; d++) {
        FZ_CHECK(a.shape[d] >= 0, "dimension %d is %lld", d, (long long)a.shape[d]);
        numel *= a.shape[d];
    }
    int isz = item_size(a.descr);
    FZ_CHECK(isz > 0, "read an unknown dtype '%s'", a.descr);
    FZ_CHECK(numel == a.numel && a.nbytes == (size_t)numel * 4, "numel %lld, nbytes %zu for a shape of %lld",
             (long long)a.numel, a.nbytes, (long long)numel);
    FZ_CHECK(a.dtype == (strcmp(a.descr, "<f4") ? SG_DTYPE_I32 : SG_DTYPE_F32), "'%s' read as %s", a.descr,
             sg_dtype_name(a.dtype));
    FZ_CHECK(a.data_offset + numel * isz == (int64_t)size, "data from byte %lld, %lld items of %d bytes, in a "
             "%zu-byte file", (long long)a.data_offset, (long long)numel, isz, size);
    /* Converted integers hold what the file holds (narrow types: every value fits). */
    if (isz <= 2)
        for (int64_t i = 0; i < numel; i++) {
            const uint8_t *p = data + a.data_offset + i * isz;
            int32_t want = isz == 1 ? (a.descr[1] == 'u' ? (int32_t)p[0] : (int32_t)(int8_t)p[0])
                                    : (a.descr[1] == 'u' ? (int32_t)(uint16_t)(p[0] | p[1] << 8)
                                                         : (int32_t)(int16_t)(uint16_t)(p[0] | p[1] << 8));
            FZ_CHECK(((int32_t *)a.data)[i] == want, "element %lld: %d, the file holds %d", (long long)i,
                     ((int32_t *)a.data)[i], want);
        }
    sg_npy_free(&a);
    return 0;
}
