/* provenance.c — SHA-256 of buffers and files through mbedTLS, as lowercase hex.
 * Hashes are the audit trail: never home-made, never truncated. */
#include "ember.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <mbedtls/sha256.h>

void ember_sha256_digest_hex(const unsigned char digest[32], char out[65]) {
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        out[2 * i] = hex[digest[i] >> 4];
        out[2 * i + 1] = hex[digest[i] & 15];
    }
    out[64] = 0;
}

void ember_sha256_hex(const void *data, size_t len, char out[65]) {
    unsigned char digest[32];
    mbedtls_sha256_ret(data, len, digest, 0);
    ember_sha256_digest_hex(digest, out);
}

ember_status ember_sha256_file_hex(const char *path, char out[65], ember_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return ember_error_set(err, EMBER_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    mbedtls_sha256_context ctx;
    mbedtls_sha256_init(&ctx);
    mbedtls_sha256_starts_ret(&ctx, 0);
    unsigned char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) mbedtls_sha256_update_ret(&ctx, buf, n);
    bool bad = ferror(f);
    fclose(f);
    unsigned char digest[32];
    mbedtls_sha256_finish_ret(&ctx, digest);
    mbedtls_sha256_free(&ctx);
    if (bad) return ember_error_set(err, EMBER_ERR_IO, "%s: read error", path);
    ember_sha256_digest_hex(digest, out);
    return EMBER_OK;
}
