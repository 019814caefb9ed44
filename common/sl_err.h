/*
 * sl_err: one error vocabulary for all of Sluice.
 *
 * Functions return int: 0 on success, a negative SL_E* code on failure (errno values pass
 * through as -errno). Where the reason matters, the last parameter is an sl_err_t * (NULL
 * allowed) that carries the code plus a bounded, human message written in PostgreSQL's
 * error style: lowercase, no trailing period, "could not X" when a retry may succeed,
 * "cannot X" when it will not. Messages never contain payloads or secrets: callers pass
 * names and sizes, not values.
 *
 * thread: any; sl_err_t is a plain value owned by the caller.
 */
#ifndef SL_ERR_H
#define SL_ERR_H

#include <stddef.h>

/* XX(name, value, description). Values are negative and below -errno range (-4096). */
#define SL_ERR_MAP(XX)                                                                             \
    XX(EINVAL, -5001, "invalid argument")                                                          \
    XX(ENOMEM, -5002, "out of memory")                                                             \
    XX(ETOOBIG, -5003, "size limit exceeded")                                                      \
    XX(EDECODE, -5004, "malformed input")                                                          \
    XX(EVERSION, -5005, "unsupported version")                                                     \
    XX(EMISSING, -5006, "required field missing")                                                  \
    XX(ECONFIG, -5007, "invalid configuration")                                                    \
    XX(EKAFKA, -5008, "kafka error")                                                               \
    XX(EREDIS, -5009, "redis error")                                                               \
    XX(EPG, -5010, "postgresql error")                                                             \
    XX(EHTTP, -5011, "http error")                                                                 \
    XX(ECRYPTO, -5012, "cryptography error")                                                       \
    XX(ENOTFOUND, -5013, "not found")                                                              \
    XX(ETIMEDOUT, -5014, "timed out")                                                              \
    XX(ESTATE, -5015, "invalid state")                                                             \
    XX(EIO, -5016, "input/output error")                                                           \
    XX(EDENIED, -5017, "refused by policy")

enum sl_err_code {
    SL_OK = 0,
#define SL_ERR_ENUM(name, val, desc) SL_##name = (val),
    SL_ERR_MAP(SL_ERR_ENUM)
#undef SL_ERR_ENUM
};

#define SL_ERR_MSG_MAX 256

typedef struct sl_err {
    int code;                 /* SL_OK or a negative SL_E* / -errno */
    char msg[SL_ERR_MSG_MAX]; /* human detail, NUL-terminated; "" when unset */
} sl_err_t;

/* Short description of code ("invalid argument"); never NULL. */
const char *sl_strerror(int code);
/* Symbolic name of code ("SL_EINVAL", "ECONNREFUSED"); never NULL. */
const char *sl_err_name(int code);

/*
 * Fill err (NULL-safe) with code and a printf-style message; returns code so callers can
 * write `return sl_err_set(err, SL_EINVAL, "...")`. fmt must be a literal: external data
 * goes in as %s arguments, never as the format.
 */
int sl_err_set(sl_err_t *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Reset err to SL_OK / "" (NULL-safe). */
void sl_err_clear(sl_err_t *err);

#endif /* SL_ERR_H */
