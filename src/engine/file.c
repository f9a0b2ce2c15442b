/* file.c — the regular-file gate: O_NONBLOCK open, fstat S_ISREG, size-bounded reads.
 * Must not map or parse anything; it only decides whether a path may be read and reads it. */
#include "file.h"
#include "escape.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *file_kind(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO (named pipe)";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "not a regular file";
}

ember_status ember_file_open_regular(const char *path, int *fd, struct stat *st, ember_error *err) {
    char q[512];
    *fd = -1;
    ember_escape(q, sizeof q, path, strlen(path), 400);
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever */
    int f = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (f < 0) return ember_error_set(err, EMBER_ERR_IO, "%s: cannot open: %s", q, strerror(errno));
    if (fstat(f, st) != 0) {
        int e = errno;
        close(f);
        return ember_error_set(err, EMBER_ERR_IO, "%s: cannot stat: %s", q, strerror(e));
    }
    if (!S_ISREG(st->st_mode)) {
        close(f);
        return ember_error_set(err, EMBER_ERR_IO, "%s: is %s, not a regular file", q, file_kind(st->st_mode));
    }
    /* regular files never block; clear the flag so later reads behave normally */
    int flags = fcntl(f, F_GETFL);
    if (flags >= 0) fcntl(f, F_SETFL, flags & ~O_NONBLOCK);
    *fd = f;
    return EMBER_OK;
}

ember_status ember_file_read_all(const char *path, size_t max_bytes, char **data, size_t *len, ember_error *err) {
    char q[512];
    struct stat st;
    int fd;
    *data = NULL;
    *len = 0;
    ember_status s = ember_file_open_regular(path, &fd, &st, err);
    if (s != EMBER_OK) return s;
    ember_escape(q, sizeof q, path, strlen(path), 400);
    if ((uint64_t)st.st_size > (uint64_t)max_bytes) {
        close(fd);
        return ember_error_set(err, EMBER_ERR_IO, "%s: file is %lld bytes, more than the limit of %zu", q,
                               (long long)st.st_size, max_bytes);
    }
    size_t size = (size_t)st.st_size;
    char *buf = malloc(size + 1);
    if (!buf) {
        close(fd);
        return ember_error_set(err, EMBER_ERR_NOMEM, "%s: out of memory reading %zu bytes", q, size);
    }
    /* read at most the size fstat reported: a file growing meanwhile cannot make this unbounded */
    size_t got = 0;
    while (got < size) {
        ssize_t r = read(fd, buf + got, size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            free(buf);
            close(fd);
            return ember_error_set(err, EMBER_ERR_IO, "%s: read failed: %s", q, strerror(e));
        }
        if (r == 0) break; /* shrank meanwhile: keep what is there */
        got += (size_t)r;
    }
    close(fd);
    buf[got] = '\0';
    *data = buf;
    *len = got;
    return EMBER_OK;
}
