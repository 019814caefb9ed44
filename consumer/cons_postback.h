/*
 * cons_postback: affiliate postback URL templates.
 *
 * A template such as https://t.example/pb?click_id={click_id}&payout={payout} is filled from
 * the delivery's macro values; each value is percent-encoded as an RFC 3986 query component
 * (everything but ALPHA DIGIT - . _ ~ is escaped, so '&', '=', '#', spaces and non-ASCII can
 * never change the URL's structure). A placeholder whose macro is absent is a permanent,
 * named error for that delivery: a literal "{click_id}" is never sent.
 *
 * Expanded URLs carry click ids and tokens: they are never logged (log endpoint id and host).
 *
 * thread: any; pure functions.
 */
#ifndef CONS_POSTBACK_H
#define CONS_POSTBACK_H

#include <stddef.h>

#include "common/sl_err.h"
#include "common/sl_record.h"

/*
 * Expand tpl with macros (n entries, borrowed). On success *out is a malloc'd URL (caller
 * frees) and 0 is returned. Errors: SL_EMISSING "macro \"name\" missing" (the name is ours,
 * not a value), SL_EDECODE for an unbalanced or invalid placeholder, SL_ETOOBIG past max_len,
 * SL_EINVAL when the expanded path has a "." or ".." segment (libcurl would remove it, so a
 * value such as ".." in /pb/{click_id}/conv would reach /conv; '.' itself is unreserved).
 */
int cons_postback_expand(const char *tpl,
                         const struct sl_kv *macros,
                         size_t n,
                         size_t max_len,
                         char **out,
                         sl_err_t *err);

/* Validate a template at registration time: braces balanced, names [A-Za-z0-9_]{1,64}.
 * Returns 0 or SL_EDECODE naming the position. */
int cons_postback_validate(const char *tpl, sl_err_t *err);

#endif /* CONS_POSTBACK_H */
