/* memory.h — how much memory a new allocation may still take: the smaller of the kernel's
 * MemAvailable and what RLIMIT_AS leaves, so a KV cache that cannot fit is refused up front. */
#ifndef EMBER_MEMORY_H
#define EMBER_MEMORY_H

#include <stdint.h>

/* Bytes this process may still allocate, or UINT64_MAX when nothing says; *source names the
 * bound that decided ("MemAvailable", "RLIMIT_AS", or "no limit known"). */
uint64_t ember_memory_available(const char **source);

#endif
