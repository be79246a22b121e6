/* fuzz.h: what the fuzz targets share: one CPU context for the process, the input written to
 * a file in a private temporary directory (the readers take paths), and a check that aborts so
 * that libFuzzer (or the replay driver) reports a broken invariant as a crash.
 * Header-only: each target is one .c file that includes it and defines LLVMFuzzerTestOneInput;
 * built with -fsanitize=fuzzer it is a libFuzzer target, built with replay.c it runs the
 * checked-in corpus (ctest fuzz_*_replay). */
#ifndef SG_FUZZ_H
#define SG_FUZZ_H

#define _POSIX_C_SOURCE 200809L

#include "core/core.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* An invariant of the reader under test; a failure is a finding. */
#define FZ_CHECK(cond, ...)                                                                   \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            fprintf(stderr, "FUZZ CHECK FAILED %s:%d: %s: ", __FILE__, __LINE__, #cond);      \
            fprintf(stderr, __VA_ARGS__);                                                     \
            fprintf(stderr, "\n");                                                            \
            abort();                                                                          \
        }                                                                                     \
    } while (0)

/* Set-up that must work (contexts, the fixed tensors); not a finding, but nothing to fuzz. */
#define FZ_OK(ctx, call)                                                                      \
    do {                                                                                      \
        sg_status fz_st_ = (call);                                                            \
        if (fz_st_ != SG_OK) {                                                                \
            fprintf(stderr, "fuzz set-up: %s returned %s: %s\n", #call,                      \
                    sg_status_name(fz_st_), sg_ctx_last_error(ctx));                          \
            exit(2);                                                                          \
        }                                                                                     \
    } while (0)

/* The process's CPU context, made on first use. A memory limit keeps a header that declares
 * huge tensors from reaching the fuzzer's RSS limit (it must be refused, not allocated). */
static inline sg_ctx *fz_ctx(void)
{
    static sg_ctx *ctx;
    if (!ctx) {
        sg_ctx_options o = sg_ctx_options_default();
        o.backend = SG_BACKEND_CPU;
        o.alloc_limit_bytes = (size_t)256 << 20;
        FZ_OK(NULL, sg_ctx_create(&o, &ctx));
    }
    return ctx;
}

/* SG_FUZZ_VERBOSE=1: each call's status and message on stderr (for replaying one input). */
static inline void fz_say(sg_ctx *ctx, const char *call, sg_status st)
{
    static int verbose = -1;
    if (verbose < 0) verbose = getenv("SG_FUZZ_VERBOSE") && *getenv("SG_FUZZ_VERBOSE") != '0';
    if (verbose)
        fprintf(stderr, "  %s: %s%s%s\n", call, sg_status_name(st), st == SG_OK ? "" : ": ",
                st == SG_OK ? "" : sg_ctx_last_error(ctx));
}

static char fz_dir[64];
static char fz_file[128];

static inline void fz_cleanup(void)
{
    if (fz_file[0]) unlink(fz_file);
    if (fz_dir[0]) rmdir(fz_dir);
}

/* data[0, size) written to <private tmp dir>/<name>, rewritten on each call; the path. */
static inline const char *fz_write_file(const char *name, const uint8_t *data, size_t size)
{
    if (!fz_dir[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(fz_dir, sizeof fz_dir, "%s/sg-fuzz-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(fz_dir)) {
            perror("fuzz: mkdtemp");
            exit(2);
        }
        atexit(fz_cleanup);
    }
    snprintf(fz_file, sizeof fz_file, "%s/%s", fz_dir, name);
    FILE *f = fopen(fz_file, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) {
        perror("fuzz: writing the input file");
        exit(2);
    }
    return fz_file;
}

#endif /* SG_FUZZ_H */
