/* replay.c: main() for a fuzz target built without libFuzzer: runs LLVMFuzzerTestOneInput once
 * on each file named, and on each file of each directory named (sorted, so runs repeat). The
 * checked-in corpus is a regression suite this way (ctest fuzz_*_replay, any compiler, under
 * the sanitizers in make test-asan), and a reproducer replays with
 *   SG_FUZZ_VERBOSE=1 build/fuzz/fuzz_text_replay crash-<sha1>
 * (SG_FUZZ_VERBOSE=1: what each reader call returned and said). */
#include "fuzz.h"

#include <dirent.h>
#include <sys/stat.h>

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return 1;
    }
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) {
            uint8_t *nb = realloc(buf, cap *= 2);
            if (!nb) free(buf);
            buf = nb;
        }
    }
    int err = ferror(f);
    fclose(f);
    if (!buf || err) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        free(buf);
        return 1;
    }
    /* libFuzzer hands the target a buffer of exactly n bytes: so does this, for ASan. */
    uint8_t *exact = malloc(n ? n : 1);
    memcpy(exact, buf, n);
    free(buf);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int run_dir(const char *dir, int *count)
{
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "replay: cannot open directory %s\n", dir);
        return 1;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    for (struct dirent *de; (de = readdir(d));) {
        if (de->d_name[0] == '.') continue;
        if (n == cap) names = realloc(names, (cap = cap ? 2 * cap : 64) * sizeof *names);
        names[n++] = strdup(de->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, by_name);
    int fails = 0;
    for (size_t i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        fails += run_file(path);
        ++*count;
        free(names[i]);
    }
    free(names);
    return fails;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE_OR_DIR...\n"
                        "Runs the fuzz target once on each file (a directory: on each file in it).\n",
                argv[0]);
        return 2;
    }
    int fails = 0, count = 0;
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        if (stat(argv[i], &sb) == 0 && S_ISDIR(sb.st_mode)) {
            fails += run_dir(argv[i], &count);
        } else {
            fprintf(stderr, "replay: %s\n", argv[i]);
            fails += run_file(argv[i]);
            count++;
        }
    }
    printf("%s: %d input(s) run, %d unreadable\n", argv[0], count, fails);
    return fails ? 1 : 0;
}
