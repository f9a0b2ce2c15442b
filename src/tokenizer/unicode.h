/* unicode.h — the few Unicode facts the tokenizers need: UTF-8 coding, character classes, NFC.
 * Every class and normalization comes from libutf8proc; nothing here is a hand-typed table. */
#ifndef EMBER_UNICODE_H
#define EMBER_UNICODE_H

#include "types.h"

/* Character classes as the tokenizers' split patterns name them. */
#define EMBER_CP_LETTER 1u  /* \p{L}: Lu Ll Lt Lm Lo */
#define EMBER_CP_NUMBER 2u  /* \p{N}: Nd Nl No */
#define EMBER_CP_SPACE 4u   /* \s: the Unicode White_Space property */
#define EMBER_CP_NEWLINE 8u /* \r or \n (also SPACE) */

/* Class bits of one code point (0 for anything else: punctuation, symbols, marks, ...). */
unsigned ember_unicode_flags(int32_t cp);

/* Decodes the code point at s[0..n): returns its length 1..4, or 0 when the bytes there are not
 * valid UTF-8 (bad lead byte, truncated, overlong, surrogate, above U+10FFFF). */
size_t ember_utf8_decode(const char *s, size_t n, int32_t *cp);
/* Offset of the first byte that does not start a valid character, or n when all of s is valid. */
size_t ember_utf8_validate(const char *s, size_t n);
/* Writes cp as UTF-8 into out (room for 4); returns the length, 0 for an invalid code point. */
size_t ember_utf8_encode(int32_t cp, char out[4]);
/* Length of the (possibly incomplete) character a lead byte announces; 1 for a non-lead byte. */
size_t ember_utf8_seq_len(unsigned char lead);

/* true when s is pure ASCII (then it is already NFC and needs no utf8proc call). */
bool ember_ascii_only(const char *s, size_t n);
/* NFC of valid UTF-8 s into a malloc'd buffer (*out, *out_len; NUL-terminated). */
ember_status ember_unicode_nfc(const char *s, size_t n, char **out, size_t *out_len, ember_error *err);

/* GPT-2's byte-level alphabet: every byte gets a printable code point. Printable Latin-1 bytes
 * ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) stand for themselves; the other 68 bytes take
 * U+0100, U+0101, ... in increasing byte order. */
int32_t ember_byte_to_cp(uint8_t b);
/* The byte a code point of that alphabet stands for, or -1 when cp is not in it. */
int ember_cp_to_byte(int32_t cp);

#endif
