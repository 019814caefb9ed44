/* sl_fmt: see sl_fmt.h. */
#include "common/sl_fmt.h"

#include <limits.h>
#include <string.h>

void sl_fmt_init(struct sl_fmt *f, char *buf, size_t cap)
{
    *f = (struct sl_fmt){.buf = buf, .cap = cap, .len = 0, .over = cap == 0};
}

void sl_fmt_mem(struct sl_fmt *f, const void *s, size_t n)
{
    if (f->over)
        return;
    if (n >= f->cap - f->len) { /* the NUL needs one byte after it */
        f->over = true;
        return;
    }
    memcpy(f->buf + f->len, s, n);
    f->len += n;
}

void sl_fmt_str(struct sl_fmt *f, const char *s)
{
    sl_fmt_mem(f, s, strlen(s));
}

void sl_fmt_u64(struct sl_fmt *f, uint64_t v)
{
    char tmp[20]; /* 18446744073709551615 */
    char *p = tmp + sizeof(tmp);
    do {
        *--p = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    sl_fmt_mem(f, p, (size_t)(tmp + sizeof(tmp) - p));
}

void sl_fmt_i64(struct sl_fmt *f, int64_t v)
{
    if (v < 0) {
        sl_fmt_mem(f, "-", 1);
        sl_fmt_u64(f, (uint64_t)0 - (uint64_t)v); /* INT64_MIN too */
        return;
    }
    sl_fmt_u64(f, (uint64_t)v);
}

int sl_fmt_end(struct sl_fmt *f)
{
    if (f->over || f->len > INT_MAX) {
        if (f->cap > 0)
            f->buf[0] = '\0';
        return -1;
    }
    f->buf[f->len] = '\0';
    return (int)f->len;
}
