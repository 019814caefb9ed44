/*
 * sl_b64: strict standard base64 (see sl_b64.h).
 */
#include "common/sl_b64.h"

#include "common/sl_err.h"

static const char enc_table[64] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* Value of one alphabet character, or -1. */
static int dec_char(unsigned char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

long sl_b64_encode(const uint8_t *in, size_t n, char *out, size_t outcap)
{
    size_t need = SL_B64_ENCODED_LEN(n);
    if (n > ((size_t)-1) / 2 || outcap < need + 1)
        return SL_ETOOBIG;
    size_t o = 0;
    size_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
        out[o++] = enc_table[v >> 18];
        out[o++] = enc_table[(v >> 12) & 63];
        out[o++] = enc_table[(v >> 6) & 63];
        out[o++] = enc_table[v & 63];
    }
    if (n - i == 1) {
        uint32_t v = (uint32_t)in[i] << 16;
        out[o++] = enc_table[v >> 18];
        out[o++] = enc_table[(v >> 12) & 63];
        out[o++] = '=';
        out[o++] = '=';
    } else if (n - i == 2) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8;
        out[o++] = enc_table[v >> 18];
        out[o++] = enc_table[(v >> 12) & 63];
        out[o++] = enc_table[(v >> 6) & 63];
        out[o++] = '=';
    }
    out[o] = '\0';
    return (long)o;
}

int sl_b64_decode(const char *in, size_t n, uint8_t *out, size_t outcap, size_t *outlen)
{
    *outlen = 0;
    /* Padding: at most two '=' and only at the very end, completing a 4-character group. */
    size_t pad = 0;
    while (pad < n && pad < 3 && in[n - 1 - pad] == '=')
        pad++;
    if (pad > 2)
        return SL_EDECODE;
    size_t data = n - pad; /* alphabet characters */
    if (pad && n % 4 != 0)
        return SL_EDECODE;
    /* One leftover character carries only 6 bits: never a whole byte. */
    if (data % 4 == 1)
        return SL_EDECODE;
    size_t produced = data / 4 * 3 + (data % 4 == 2 ? 1 : data % 4 == 3 ? 2 : 0);
    if (produced > outcap)
        return SL_ETOOBIG;

    size_t o = 0;
    uint32_t acc = 0;
    unsigned bits = 0;
    for (size_t i = 0; i < data; i++) {
        int v = dec_char((unsigned char)in[i]);
        if (v < 0)
            return SL_EDECODE; /* includes '=' in the middle, whitespace, '-', '_' */
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (uint8_t)(acc >> bits);
            acc &= (1u << bits) - 1;
        }
    }
    /* Canonical form: the bits left over after the last whole byte are zero. */
    if (acc != 0)
        return SL_EDECODE;
    *outlen = o;
    return 0;
}
