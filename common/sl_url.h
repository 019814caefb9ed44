/*
 * sl_url: endpoint URLs for logs and for registration, parsed by libcurl's URL API
 * (curl_url, CURLU; the same parser that later sends the request, so what we validate is
 * what curl will connect to).
 *
 * - sl_url_redact: the only form of a URL that may reach a log line or metric label:
 *   scheme://host[:port]/path, with userinfo, query string and fragment removed.
 * - sl_url_host: just the host, for logs and per-host metrics.
 * - sl_url_validate: the checks an endpoint URL must pass to be registered.
 *
 * Query strings are where postback URLs carry click ids and payouts, and userinfo is a
 * credential, so neither the redactor nor any error message ever echoes them; on a URL that
 * does not parse, the redactor writes a fixed placeholder rather than the input.
 *
 * thread: any (curl_url handles are per call; no curl_global_init needed for the URL API).
 */
#ifndef SL_URL_H
#define SL_URL_H

#include <stddef.h>

#include "common/sl_err.h"

#define SL_URL_MAX         2048            /* bytes of an endpoint URL (registration limit) */
#define SL_URL_INVALID_STR "[invalid url]" /* what the redactor writes for unparsable input */

/*
 * Write scheme://host[:port]/path of url (borrowed) into out (outlen bytes, NUL-terminated).
 * IPv6 hosts keep their brackets; the port appears only when the URL names one; the path is
 * as curl normalised it (dot segments removed, percent-encoding kept). Returns 0; SL_EDECODE
 * when curl cannot parse url (out = SL_URL_INVALID_STR, truncated to fit); SL_ETOOBIG when
 * the redacted form did not fit (out holds a truncated, still redacted prefix).
 */
int sl_url_redact(const char *url, char *out, size_t outlen);

/*
 * Write the host of url (borrowed) into out (outlen bytes): "example.com", "192.0.2.1" or
 * "[2001:db8::1]" (brackets kept for IPv6). Returns 0, SL_EDECODE (unparsable or no host;
 * out = "") or SL_ETOOBIG (out = "").
 */
int sl_url_host(const char *url, char *out, size_t outlen);

/*
 * Check an endpoint URL for registration: non-empty, at most SL_URL_MAX bytes, printable
 * ASCII only (no whitespace or control bytes; percent-encode the path, use the punycode
 * form of international hosts), parsable by curl, scheme http or https, a host, no userinfo
 * (credentials belong in headers, not URLs that end up in configs), port 1..65535 when
 * given. Returns 0 or SL_EMISSING / SL_ETOOBIG / SL_EINVAL with a message naming the rule
 * broken (never the URL's query or userinfo).
 */
int sl_url_validate(const char *url, sl_err_t *err);

/*
 * Check a delivery proxy URL (delivery_proxy): parsable by curl, scheme http, https (when
 * this libcurl has HTTPS-proxy support) or socks5h (not socks5: its names would be resolved
 * here, past the SSRF rules), a host, nothing after the authority but "/", no zone id, port
 * 1..65535 when given; user:password@ allowed. Returns 0 or SL_EINVAL naming the rule, never
 * echoing the URL (its userinfo is a credential).
 */
int sl_url_proxy_check(const char *url, sl_err_t *err);

#endif /* SL_URL_H */
