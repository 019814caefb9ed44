/*
 * sl_err: error codes generated from SL_ERR_MAP, and the bounded message carrier.
 */
#include "common/sl_err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *sl_strerror(int code)
{
    switch (code) {
    case SL_OK:
        return "success";
#define SL_ERR_STR(name, val, desc)                                                                \
    case SL_##name:                                                                                \
        return desc;
        SL_ERR_MAP(SL_ERR_STR)
#undef SL_ERR_STR
    default:
        break;
    }
    if (code < 0 && code > -4096)
        return strerror(-code);
    return "unknown error";
}

const char *sl_err_name(int code)
{
    switch (code) {
    case SL_OK:
        return "SL_OK";
#define SL_ERR_NAME(name, val, desc)                                                               \
    case SL_##name:                                                                                \
        return "SL_" #name;
        SL_ERR_MAP(SL_ERR_NAME)
#undef SL_ERR_NAME
    default:
        break;
    }
    if (code < 0 && code > -4096) {
        const char *n = strerrorname_np(-code);
        return n ? n : "ERRNO";
    }
    return "SL_EUNKNOWN";
}

int sl_err_set(sl_err_t *err, int code, const char *fmt, ...)
{
    if (!err)
        return code;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
    va_end(ap);
    if (n < 0)
        err->msg[0] = '\0';
    return code;
}

void sl_err_clear(sl_err_t *err)
{
    if (!err)
        return;
    err->code = SL_OK;
    err->msg[0] = '\0';
}
