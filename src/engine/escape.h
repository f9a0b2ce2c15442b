/* escape.h — bytes taken from a file made safe to print inside an error message.
 * Control bytes, DEL and quotes become \xNN; the result is cut short with "..." when too long. */
#ifndef EMBER_ESCAPE_H
#define EMBER_ESCAPE_H

#include <stddef.h>

/* Writes the escaped form of s[0..len) into dst (cap bytes, NUL-terminated); returns dst. At most
 * max_in input bytes are shown. UTF-8 sequences pass through unchanged (terminals render them). */
const char *ember_escape(char *dst, size_t cap, const char *s, size_t len, size_t max_in);

#endif
