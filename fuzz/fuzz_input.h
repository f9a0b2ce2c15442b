/* fuzz_input.h — hands a fuzzer's bytes to code that wants a path: an in-memory file (memfd) named
 * through /proc/self/fd, rewritten for each input. Shared by the harnesses in fuzz/. */
#ifndef EMBER_FUZZ_INPUT_H
#define EMBER_FUZZ_INPUT_H

#include <stddef.h>
#include <stdint.h>

/* Replaces the in-memory file's contents with data[0..size) and returns its path (static). */
const char *ember_fuzz_file(const uint8_t *data, size_t size);

#endif
