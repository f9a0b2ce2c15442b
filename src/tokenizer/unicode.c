/* unicode.c — UTF-8 coding, character classes and NFC for the tokenizers, on top of libutf8proc.
 * Must not carry its own category tables: utf8proc's database is the single source. */
#include "unicode.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

unsigned ember_unicode_flags(int32_t cp) {
    /* ASCII first: most text is ASCII and these answers are what utf8proc would give. */
    if (cp < 0x80) {
        if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return EMBER_CP_LETTER;
        if (cp >= '0' && cp <= '9') return EMBER_CP_NUMBER;
        if (cp == '\n' || cp == '\r') return EMBER_CP_SPACE | EMBER_CP_NEWLINE;
        if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D)) return EMBER_CP_SPACE;
        return 0;
    }
    /* White_Space outside ASCII is U+0085 plus exactly the Zs, Zl and Zp categories. */
    if (cp == 0x85) return EMBER_CP_SPACE;
    switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: return EMBER_CP_LETTER;
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO: return EMBER_CP_NUMBER;
    case UTF8PROC_CATEGORY_ZS:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP: return EMBER_CP_SPACE;
    default: return 0;
    }
}

size_t ember_utf8_seq_len(unsigned char lead) {
    if (lead < 0x80) return 1;
    if ((lead & 0xE0) == 0xC0) return 2;
    if ((lead & 0xF0) == 0xE0) return 3;
    if ((lead & 0xF8) == 0xF0) return 4;
    return 1;
}

size_t ember_utf8_decode(const char *str, size_t n, int32_t *cp) {
    const unsigned char *s = (const unsigned char *)str;
    if (n == 0) return 0;
    if (s[0] < 0x80) {
        *cp = s[0];
        return 1;
    }
    size_t len;
    int32_t c, min;
    if (s[0] >= 0xC2 && s[0] <= 0xDF) { /* 0xC0/0xC1 would only start overlong forms */
        len = 2;
        c = s[0] & 0x1F;
        min = 0x80;
    } else if ((s[0] & 0xF0) == 0xE0) {
        len = 3;
        c = s[0] & 0x0F;
        min = 0x800;
    } else if (s[0] >= 0xF0 && s[0] <= 0xF4) {
        len = 4;
        c = s[0] & 0x07;
        min = 0x10000;
    } else {
        return 0;
    }
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        c = (c << 6) | (s[i] & 0x3F);
    }
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return 0;
    *cp = c;
    return len;
}

size_t ember_utf8_validate(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if ((unsigned char)s[i] < 0x80) {
            i++;
            continue;
        }
        int32_t cp;
        size_t len = ember_utf8_decode(s + i, n - i, &cp);
        if (len == 0) return i;
        i += len;
    }
    return n;
}

size_t ember_utf8_encode(int32_t cp, char out[4]) {
    if (cp < 0 || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return (size_t)utf8proc_encode_char(cp, (utf8proc_uint8_t *)out);
}

bool ember_ascii_only(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return false;
    return true;
}

ember_status ember_unicode_nfc(const char *s, size_t n, char **out, size_t *out_len, ember_error *err) {
    utf8proc_uint8_t *dst = NULL;
    /* STABLE + COMPOSE is NFC (utf8proc_NFC uses the same options, but needs NUL termination). */
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst,
                                      (utf8proc_option_t)(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    if (r < 0) {
        free(dst);
        return ember_error_set(err, r == UTF8PROC_ERROR_NOMEM ? EMBER_ERR_NOMEM : EMBER_ERR_ARG,
                               "NFC normalization failed: %s", utf8proc_errmsg(r));
    }
    *out = (char *)dst;
    *out_len = (size_t)r;
    return EMBER_OK;
}

/* The bytes that stand for themselves in GPT-2's alphabet. */
static bool byte_is_printable(unsigned b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

int32_t ember_byte_to_cp(uint8_t b) {
    if (byte_is_printable(b)) return b;
    int32_t shifted = 0; /* how many non-printable bytes come before b */
    for (unsigned i = 0; i < b; i++)
        if (!byte_is_printable(i)) shifted++;
    return 256 + shifted;
}

int ember_cp_to_byte(int32_t cp) {
    if (cp >= 0 && cp < 256) return byte_is_printable((unsigned)cp) ? cp : -1;
    if (cp < 256 || cp >= 256 + 68) return -1;
    int32_t k = cp - 256;
    for (unsigned b = 0; b < 256; b++) {
        if (byte_is_printable(b)) continue;
        if (k-- == 0) return (int)b;
    }
    return -1;
}
