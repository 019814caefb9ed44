/* sl_hex: see sl_hex.h. */
#include "common/sl_hex.h"

#include <stdint.h>

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
