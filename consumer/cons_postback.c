/*
 * cons_postback: template expansion (see cons_postback.h).
 */
#include "consumer/cons_postback.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/sl_mem.h"

static const char hexd[] = "0123456789ABCDEF";

static int is_unreserved(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '.' || c == '_' || c == '~';
}

static int is_name(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
}

static int encode_into(struct sl_buf *b, const char *v)
{
    for (const unsigned char *p = (const unsigned char *)v; *p; p++) {
        if (is_unreserved(*p)) {
            if (sl_buf_append(b, p, 1) != 0)
                return SL_ETOOBIG;
        } else {
            char e[3] = {'%', hexd[*p >> 4], hexd[*p & 15]};
            if (sl_buf_append(b, e, 3) != 0)
                return SL_ETOOBIG;
        }
    }
    return 0;
}

/* Walk the template; with macros == NULL only validates. */
static int walk(const char *tpl,
                const struct sl_kv *macros,
                size_t n,
                struct sl_buf *b,
                int validate_only,
                sl_err_t *err)
{
    const char *p = tpl;
    while (*p) {
        if (*p == '}')
            return sl_err_set(err, SL_EDECODE, "template: unmatched '}' at position %zu",
                              (size_t)(p - tpl));
        if (*p != '{') {
            const char *q = p;
            while (*q && *q != '{' && *q != '}')
                q++;
            if (!validate_only && sl_buf_append(b, p, (size_t)(q - p)) != 0)
                return sl_err_set(err, SL_ETOOBIG, "expanded postback url too long");
            p = q;
            continue;
        }
        const char *name = p + 1;
        const char *q = name;
        while (is_name((unsigned char)*q))
            q++;
        size_t nl = (size_t)(q - name);
        if (*q != '}' || nl == 0 || nl > 64)
            return sl_err_set(err, SL_EDECODE,
                              "template: invalid placeholder at position %zu (expected "
                              "{name} with [A-Za-z0-9_]{1,64})",
                              (size_t)(p - tpl));
        if (!validate_only) {
            const char *val = NULL;
            for (size_t i = 0; i < n; i++) {
                if (strlen(macros[i].name) == nl && memcmp(macros[i].name, name, nl) == 0) {
                    val = macros[i].value;
                    break;
                }
            }
            if (!val)
                return sl_err_set(err, SL_EMISSING, "macro \"%.*s\" missing from the delivery",
                                  (int)nl, name);
            if (encode_into(b, val) != 0)
                return sl_err_set(err, SL_ETOOBIG, "expanded postback url too long");
        }
        p = q + 1;
    }
    return 0;
}

/* Does the path of url (after scheme://authority, up to '?' or '#') have a "." or ".."
 * segment? libcurl removes dot segments before sending (RFC 3986 5.2.4), so one made by a
 * macro value would send the request to another path of the partner's host. */
static bool has_dot_segment(const char *url)
{
    const char *p = strstr(url, "://");
    p = p ? p + 3 : url;
    p += strcspn(p, "/?#"); /* past the authority */
    while (*p == '/') {
        const char *seg = p + 1;
        size_t n = strcspn(seg, "/?#");
        if ((n == 1 && seg[0] == '.') || (n == 2 && seg[0] == '.' && seg[1] == '.'))
            return true;
        p = seg + n;
    }
    return false;
}

int cons_postback_expand(const char *tpl,
                         const struct sl_kv *macros,
                         size_t n,
                         size_t max_len,
                         char **out,
                         sl_err_t *err)
{
    struct sl_buf b;
    sl_buf_init(&b, max_len);
    *out = NULL;
    int rc = walk(tpl, macros, n, &b, 0, err);
    if (rc != 0) {
        sl_buf_fini(&b);
        return rc;
    }
    if (sl_buf_append(&b, "", 0) != 0) {
        sl_buf_fini(&b);
        return sl_err_set(err, SL_ETOOBIG, "expanded postback url too long");
    }
    if (has_dot_segment((const char *)b.data)) {
        sl_buf_fini(&b);
        return sl_err_set(err, SL_EINVAL,
                          "expanded postback url has a \".\" or \"..\" path segment (a macro "
                          "value may not move the request to another path)");
    }
    *out = (char *)b.data;
    return 0;
}

int cons_postback_validate(const char *tpl, sl_err_t *err)
{
    return walk(tpl, NULL, 0, NULL, 1, err);
}
