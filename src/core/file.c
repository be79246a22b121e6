/* file.c: what a user names, read strictly: whole numbers in model names and checkpoint
 * metadata, and the files (checkpoints, data sets), opened without blocking on a FIFO, refusing
 * anything but a regular file before a byte is read and saying what the path is instead. */
#define _POSIX_C_SOURCE 200809L

#include "core/core.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

bool sg_parse_decimal(const char *s, size_t n, int64_t max, int64_t *out)
{
    if (n == 0 || (s[0] == '0' && n > 1)) return false;
    int64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9' || v > (max - (s[i] - '0')) / 10) return false;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return true;
}

const char *sg_file_kind(mode_t m)
{
    if (S_ISREG(m)) return "a regular file";
    if (S_ISDIR(m)) return "a directory";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISFIFO(m)) return "a FIFO (named pipe)";
    if (S_ISSOCK(m)) return "a socket";
    if (S_ISLNK(m)) return "a symbolic link";
    return "not a regular file";
}

static sg_status not_regular(sg_ctx *ctx, const char *fn, const char *path, mode_t m)
{
    return sg_fail(ctx, SG_ERR_INVALID, "%s: '%s' is %s, not a regular file: give a file%s", fn, path,
                   sg_file_kind(m),
                   S_ISDIR(m) ? "" : " (a stream such as a pipe, /dev/zero or /dev/urandom has no size to check "
                                     "before reading it)");
}

sg_status sg_file_open_regular(sg_ctx *ctx, const char *fn, const char *path, int *fd_out, int64_t *size)
{
    struct stat sb;
    *fd_out = -1;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        int err = errno;
        /* A socket cannot be opened at all (ENXIO): say what it is rather than why. */
        if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode)) return not_regular(ctx, fn, path, sb.st_mode);
        return sg_fail(ctx, SG_ERR_IO, "%s: cannot open '%s': %s", fn, path, strerror(err));
    }
    sg_status st = SG_OK;
    int flags;
    if (fstat(fd, &sb) != 0)
        st = sg_fail(ctx, SG_ERR_IO, "%s: cannot stat '%s': %s", fn, path, strerror(errno));
    else if (!S_ISREG(sb.st_mode))
        st = not_regular(ctx, fn, path, sb.st_mode);
    else if ((flags = fcntl(fd, F_GETFL)) < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0)
        st = sg_fail(ctx, SG_ERR_IO, "%s: cannot make '%s' blocking: %s", fn, path, strerror(errno));
    if (st != SG_OK) {
        close(fd);
        return st;
    }
    *fd_out = fd;
    *size = (int64_t)sb.st_size;
    return SG_OK;
}
