/* error.c — the one way ember code fills an ember_error (types.h): a status plus a formatted
 * message. At the bottom, so kernels, tokenizer and engine all report failures through it. */
#include "types.h"

#include <stdarg.h>
#include <stdio.h>

ember_status ember_error_set(ember_error *err, ember_status code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}
