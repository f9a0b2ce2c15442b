/* error.c — the one way engine code reports a failure: a status plus a message in a caller-owned
 * ember_error. Never exits, never touches Lua. */
#include "ember.h"

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
