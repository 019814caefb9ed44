/*
 * sl_b64: strict standard base64 (RFC 4648 section 4, alphabet A-Z a-z 0-9 + /).
 *
 * Used for the secret and signature encodings of Standard Webhooks (sl_sign) and for the
 * master key (sl_secretbox). Decoding is strict on purpose: no whitespace, no URL-safe
 * alphabet, '=' only as final padding, and the unused low bits of the last character must
 * be zero (so every byte string has exactly one accepted encoding). Padding is optional
 * because the official Standard Webhooks libraries accept unpadded secrets.
 *
 * thread: any; pure functions.
 */
#ifndef SL_B64_H
#define SL_B64_H

#include <stddef.h>
#include <stdint.h>

/* Characters needed to encode n bytes with padding, excluding the NUL. */
#define SL_B64_ENCODED_LEN(n) (4 * (((size_t)(n) + 2) / 3))
/* Upper bound of bytes produced by decoding n characters. */
#define SL_B64_DECODED_MAX(n) (3 * (((size_t)(n) + 3) / 4))

/*
 * Encode n bytes of in (borrowed; NULL allowed when n == 0) into out as padded base64 plus
 * a NUL. outcap must be >= SL_B64_ENCODED_LEN(n) + 1. Returns the encoded length (without
 * the NUL, >= 0), or SL_ETOOBIG (out untouched) when it does not fit.
 */
long sl_b64_encode(const uint8_t *in, size_t n, char *out, size_t outcap);

/*
 * Decode n characters of in (borrowed, need not be NUL-terminated) into out (outcap bytes).
 * *outlen (OUT) receives the decoded length. Returns 0, SL_EDECODE for anything that is not
 * canonical base64 (bad character, misplaced or excess '=', impossible length, non-zero
 * trailing bits), or SL_ETOOBIG when the result would exceed outcap. On failure out may hold
 * partial data: the caller wipes it when it is secret.
 */
int sl_b64_decode(const char *in, size_t n, uint8_t *out, size_t outcap, size_t *outlen);

#endif /* SL_B64_H */
