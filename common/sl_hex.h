/*
 * sl_hex: hexadecimal text, the one copy Sluice uses for key hashes, job ids, tokens,
 * fingerprints and the inputs it decodes (master keys, %XX escapes, \u escapes).
 *
 * thread: any; pure functions.
 */
#ifndef SL_HEX_H
#define SL_HEX_H

#include <stddef.h>

/* Write the n bytes at in as 2n lower-case hex characters and a NUL into out. */
void sl_hex_encode(const void *in, size_t n, char *out);

/* The value of hex digit c (0-9, a-f, A-F), or -1. */
int sl_hex_digit(int c);

/* The same for the lower-case digits only (0-9, a-f: the form Sluice writes), or -1. */
int sl_hex_digit_lower(int c);

/* The n bytes at s with their %XX escapes decoded, NUL-terminated, malloc'd (free it after
 * sl_secret_wipe: it is usually a credential); NULL when an escape is malformed or is %00,
 * which no C string can carry. The one decoder of URL userinfo (redis_url, delivery_proxy). */
char *sl_pct_decode(const char *s, size_t n);

#endif /* SL_HEX_H */
