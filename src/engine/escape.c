/* escape.c — the one escaper for file-supplied text in messages (keys, names, architecture).
 * Must not allocate: callers pass a stack buffer, so an error path can never fail for memory. */
#include "escape.h"

#include <stdio.h>
#include <string.h>

const char *ember_escape(char *dst, size_t cap, const char *s, size_t len, size_t max_in) {
    size_t o = 0;
    if (cap == 0) return dst;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        /* room for the longest item (\xNN), the "..." marker and the NUL */
        if (i >= max_in || o + 4 + 4 > cap) {
            if (o + 4 <= cap) memcpy(dst + o, "...", 3), o += 3;
            break;
        }
        if (c >= 0x20 && c != 0x7F && c != '\'' && c != '\\') dst[o++] = (char)c;
        else o += (size_t)snprintf(dst + o, cap - o, "\\x%02X", c);
    }
    dst[o] = '\0';
    return dst;
}
