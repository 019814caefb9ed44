/* sl_hex: see sl_hex.h. */
#include "common/sl_hex.h"

#include <stdint.h>
#include <stdlib.h>

#include "common/sl_mem.h"

void sl_hex_encode(const void *in, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    const uint8_t *p = in;
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[p[i] >> 4];
        out[2 * i + 1] = digits[p[i] & 15];
    }
    out[2 * n] = '\0';
}

int sl_hex_digit_lower(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

int sl_hex_digit(int c)
{
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return sl_hex_digit_lower(c);
}

char *sl_pct_decode(const char *s, size_t n)
{
    char *out = sl_xmalloc(n + 1);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '%') {
            out[o++] = s[i];
            continue;
        }
        int hi = i + 2 < n ? sl_hex_digit(s[i + 1]) : -1;
        int lo = i + 2 < n ? sl_hex_digit(s[i + 2]) : -1;
        if (hi < 0 || lo < 0 || (hi | lo) == 0) {
            sl_secret_wipe(out, n + 1);
            free(out);
            return NULL;
        }
        out[o++] = (char)(hi * 16 + lo);
        i += 2;
    }
    out[o] = '\0';
    return out;
}
