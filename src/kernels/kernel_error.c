/* kernel_error.c — how kernel code fills an ember_error (types.h): the kernels' own formatter, so
 * nothing under src/kernels calls up into the engine's error.c. */
#include "types.h"

#include <stdarg.h>
#include <stdio.h>

ember_status ember_kernel_error(ember_error *err, ember_status code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}
