/*
 * sl_mem: aborting allocators and bounded buffers (see sl_mem.h).
 */
#include "common/sl_mem.h"

#include <stdarg.h>
#include <stdio.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <stdlib.h>
#include <string.h>

#include "common/sl_err.h"

static void oom(size_t n)
{
    /* The logger may itself need memory; write a fixed line straight to stderr. */
    (void)fprintf(stderr, "{\"level\":\"error\",\"event\":\"out_of_memory\",\"size\":%zu}\n", n);
    abort();
}

int sl_mem_pin_mmap_threshold(size_t bytes)
{
#if defined(__GLIBC__)
    return mallopt(M_MMAP_THRESHOLD, bytes > (size_t)INT32_MAX ? INT32_MAX : (int)bytes) == 1;
#else
    (void)bytes;
    return 0;
#endif
}

void *sl_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        oom(n);
    return p;
}

void *sl_xcalloc(size_t nmemb, size_t size)
{
    void *p = calloc(nmemb ? nmemb : 1, size ? size : 1);
    if (!p)
        oom(nmemb * size);
    return p;
}

void *sl_xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q)
        oom(n);
    return q;
}

char *sl_xstrdup(const char *s)
{
    return sl_xstrndup(s, strlen(s));
}

char *sl_xstrndup(const char *s, size_t n)
{
    char *p = sl_xmalloc(n + 1);
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

void sl_secret_wipe(void *p, size_t n)
{
    if (!p)
        return;
    explicit_bzero(p, n); /* never optimised away, unlike a memset before free */
}

void sl_buf_init(struct sl_buf *b, size_t max)
{
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
    b->max = max;
}

int sl_buf_append(struct sl_buf *b, const void *p, size_t n)
{
    if (n > b->max - b->len)
        return SL_ETOOBIG;
    if (b->len + n > b->cap || !b->data) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n)
            cap *= 2;
        if (cap > b->max)
            cap = b->max;
        b->data = sl_xrealloc(b->data, cap + 1);
        b->cap = cap;
    }
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

int sl_buf_append_str(struct sl_buf *b, const char *s)
{
    return sl_buf_append(b, s, strlen(s));
}

int sl_buf_printf(struct sl_buf *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n < 0)
        return SL_EINVAL;
    if ((size_t)n < sizeof(tmp))
        return sl_buf_append(b, tmp, (size_t)n);
    char *big = sl_xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    (void)vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    int rc = sl_buf_append(b, big, (size_t)n);
    free(big);
    return rc;
}

void sl_buf_reset(struct sl_buf *b)
{
    b->len = 0;
    if (b->data)
        b->data[0] = '\0';
}

void sl_buf_fini(struct sl_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

char **sl_strv_dup(const char *const *v, size_t n)
{
    if (n == 0)
        return NULL;
    size_t total = n * sizeof(char *);
    for (size_t i = 0; i < n; i++)
        total += strlen(v[i]) + 1;
    char **out = sl_xmalloc(total);
    char *p = (char *)(out + n);
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(v[i]) + 1;
        memcpy(p, v[i], l);
        out[i] = p;
        p += l;
    }
    return out;
}
