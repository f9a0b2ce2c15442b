/* fuzz_input.c — the memfd behind ember_fuzz_file(): no disk traffic per execution.
 * Must not interpret the bytes; the harnesses do. */
#define _GNU_SOURCE
#include "fuzz_input.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

const char *ember_fuzz_file(const uint8_t *data, size_t size) {
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("ember-fuzz-input", 0);
        if (fd < 0) abort();
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0) abort();
    size_t done = 0;
    while (done < size) {
        ssize_t w = pwrite(fd, data + done, size - done, (off_t)done);
        if (w <= 0) abort();
        done += (size_t)w;
    }
    return path;
}
