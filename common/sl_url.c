/*
 * sl_url: redaction, host extraction and registration checks on top of curl's URL API.
 *
 * Parts are read one by one from the CURLU handle and the redacted form is rebuilt from the
 * safe ones only, instead of cutting the input string at '?' or '@' (which is wrong for
 * '@' in paths, '?' inside fragments, IPv6 literals and percent-encoded hosts).
 */
#include "common/sl_url.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <curl/curl.h>

#include "common/sl_hex.h"
#include "common/sl_mem.h"

/* Get one part (NULL when absent or on error). Caller frees with curl_free. */
static char *get_part(CURLU *h, CURLUPart what)
{
    char *v = NULL;
    if (curl_url_get(h, what, &v, 0) != CURLUE_OK)
        return NULL;
    return v;
}

/* Append s to out at *o, truncating; false when it did not fit. out stays terminated. */
static bool put(char *out, size_t outlen, size_t *o, const char *s)
{
    size_t n = strlen(s);
    size_t room = outlen - 1 - *o; /* *o < outlen always */
    bool fits = n <= room;
    if (!fits)
        n = room;
    memcpy(out + *o, s, n);
    *o += n;
    out[*o] = '\0';
    return fits;
}

static void put_placeholder(char *out, size_t outlen)
{
    size_t o = 0;
    out[0] = '\0';
    (void)put(out, outlen, &o, SL_URL_INVALID_STR);
}

int sl_url_redact(const char *url, char *out, size_t outlen)
{
    int rc = 0;
    CURLU *h = NULL;
    char *scheme = NULL, *host = NULL, *port = NULL, *path = NULL;
    if (outlen == 0)
        return SL_ETOOBIG;
    out[0] = '\0';
    h = curl_url();
    /* Any scheme: a log line about a bad URL must still be safe to write. */
    if (!h || !url || curl_url_set(h, CURLUPART_URL, url, CURLU_NON_SUPPORT_SCHEME) != CURLUE_OK) {
        put_placeholder(out, outlen);
        rc = SL_EDECODE;
        goto out;
    }
    scheme = get_part(h, CURLUPART_SCHEME);
    host = get_part(h, CURLUPART_HOST);
    port = get_part(h, CURLUPART_PORT); /* only when the URL names one */
    path = get_part(h, CURLUPART_PATH);
    if (!scheme) {
        put_placeholder(out, outlen);
        rc = SL_EDECODE;
        goto out;
    }
    size_t o = 0;
    bool fits = put(out, outlen, &o, scheme);
    fits = fits && put(out, outlen, &o, "://");
    fits = fits && put(out, outlen, &o, host ? host : "");
    if (port) {
        fits = fits && put(out, outlen, &o, ":");
        fits = fits && put(out, outlen, &o, port);
    }
    fits = fits && put(out, outlen, &o, path ? path : "/");
    rc = fits ? 0 : SL_ETOOBIG;
out:
    curl_free(scheme);
    curl_free(host);
    curl_free(port);
    curl_free(path);
    curl_url_cleanup(h);
    return rc;
}

int sl_url_host(const char *url, char *out, size_t outlen)
{
    int rc = 0;
    CURLU *h = NULL;
    char *host = NULL;
    if (outlen == 0)
        return SL_ETOOBIG;
    out[0] = '\0';
    h = curl_url();
    if (!h || !url || curl_url_set(h, CURLUPART_URL, url, CURLU_NON_SUPPORT_SCHEME) != CURLUE_OK) {
        rc = SL_EDECODE;
        goto out;
    }
    host = get_part(h, CURLUPART_HOST);
    if (!host || !*host) {
        rc = SL_EDECODE;
        goto out;
    }
    size_t n = strlen(host);
    if (n >= outlen) {
        rc = SL_ETOOBIG;
        goto out;
    }
    memcpy(out, host, n + 1);
out:
    curl_free(host);
    curl_url_cleanup(h);
    return rc;
}

/* Checks on the raw text, before curl sees it. */
static int check_text(const char *url, sl_err_t *err)
{
    if (!url || !*url)
        return sl_err_set(err, SL_EMISSING, "url is empty");
    size_t n = strnlen(url, SL_URL_MAX + 1);
    if (n > SL_URL_MAX)
        return sl_err_set(err, SL_ETOOBIG, "url too long: more than %d bytes", SL_URL_MAX);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)url[i];
        if (c <= 0x20 || c >= 0x7f)
            return sl_err_set(err, SL_EINVAL,
                              "url contains whitespace, a control character or a non-ascii byte "
                              "at offset %zu (percent-encode it; use punycode for hosts)",
                              i);
    }
    /* curl is lenient with slashes ("http:/h", "http:///h" both reach host h): insist on the
     * canonical authority form so what is registered reads as what is used. */
    size_t slen = strncasecmp(url, "https://", 8) == 0  ? 8
                  : strncasecmp(url, "http://", 7) == 0 ? 7
                                                        : 0;
    if (slen == 0)
        return sl_err_set(err, SL_EINVAL, "url must start with http:// or https://");
    if (url[slen] == '/' || url[slen] == '\\' || url[slen] == '\0')
        return sl_err_set(err, SL_EINVAL, "url has no host");
    return 0;
}

/* Checks on the parts curl parsed out of the URL. */
static int check_parts(CURLU *h, sl_err_t *err)
{
    int rc = 0;
    char *scheme = NULL, *host = NULL, *port = NULL, *part = NULL;
    scheme = get_part(h, CURLUPART_SCHEME);
    if (!scheme || (strcasecmp(scheme, "http") != 0 && strcasecmp(scheme, "https") != 0)) {
        rc = sl_err_set(err, SL_EINVAL, "url must start with http:// or https://");
        goto out;
    }
    /* Any userinfo, even empty ("https://@host/"), is refused. */
    static const CURLUPart userinfo[] = {CURLUPART_USER, CURLUPART_PASSWORD, CURLUPART_OPTIONS};
    for (size_t i = 0; i < sizeof(userinfo) / sizeof(userinfo[0]) && !part; i++)
        part = get_part(h, userinfo[i]);
    if (part) {
        rc = sl_err_set(err, SL_EINVAL,
                        "url must not contain user information: put credentials in the "
                        "endpoint's headers");
        goto out;
    }
    host = get_part(h, CURLUPART_HOST);
    if (!host || !*host) {
        rc = sl_err_set(err, SL_EINVAL, "url has no host");
        goto out;
    }
    part = get_part(h, CURLUPART_ZONEID);
    if (part) {
        rc = sl_err_set(err, SL_EINVAL, "url must not contain an ipv6 zone id");
        goto out;
    }
    port = get_part(h, CURLUPART_PORT);
    if (port && strspn(port, "0") == strlen(port)) { /* "0", "00": curl accepts them */
        rc = sl_err_set(err, SL_EINVAL, "url port must be 1..65535");
        goto out;
    }
out:
    curl_free(scheme);
    curl_free(host);
    curl_free(port);
    curl_free(part);
    return rc;
}

/* s (NULL: absent) decodes with sl_pct_decode. */
static bool pct_well_formed(const char *s)
{
    if (!s)
        return true;
    size_t n = strlen(s);
    char *d = sl_pct_decode(s, n);
    if (!d)
        return false;
    sl_secret_wipe(d, n);
    free(d);
    return true;
}

/* The proxy URL's user name and password, as written, decode as redis_url's do: libcurl
 * would pass a bad escape on as it is, and the proxy would refuse credentials that are not
 * the ones meant. 0 or SL_EINVAL. */
static int userinfo_check(CURLU *h, sl_err_t *err)
{
    char *user = get_part(h, CURLUPART_USER), *password = get_part(h, CURLUPART_PASSWORD);
    int rc = 0;
    if (!pct_well_formed(user))
        rc = sl_err_set(err, SL_EINVAL, "bad percent-encoding in the user name");
    else if (!pct_well_formed(password))
        rc = sl_err_set(err, SL_EINVAL, "bad percent-encoding in the password");
    curl_free(user);
    curl_free(password);
    return rc;
}

int sl_url_proxy_check(const char *url, sl_err_t *err)
{
    if (!url || !*url)
        return sl_err_set(err, SL_EINVAL, "empty");
    CURLU *h = curl_url();
    if (!h)
        return sl_err_set(err, SL_ENOMEM, "could not allocate url parser");
    int rc = 0;
    char *scheme = NULL, *host = NULL, *port = NULL, *path = NULL, *rest = NULL;
    CURLUcode uc = curl_url_set(h, CURLUPART_URL, url, CURLU_NON_SUPPORT_SCHEME);
    if (uc != CURLUE_OK || !strstr(url, "://")) {
        rc = sl_err_set(err, SL_EINVAL, "expected scheme://host:port (%s)",
                        uc != CURLUE_OK ? curl_url_strerror(uc) : "no scheme");
        goto out;
    }
    scheme = get_part(h, CURLUPART_SCHEME);
    static const char *const schemes[] = {"http", "https", "socks5h"};
    bool known = false;
    for (size_t i = 0; scheme && i < sizeof(schemes) / sizeof(schemes[0]); i++)
        known = known || strcasecmp(scheme, schemes[i]) == 0;
    if (scheme && strcasecmp(scheme, "socks5") == 0) {
        /* curl would resolve names here and send the proxy addresses, which nothing
         * checks (the consumers see only the proxy's address) */
        rc = sl_err_set(err, SL_EINVAL,
                        "socks5:// resolves names before the proxy: use socks5h://, which lets "
                        "the proxy resolve them");
        goto out;
    }
    if (!known) {
        rc = sl_err_set(err, SL_EINVAL, "the scheme must be http, https or socks5h");
        goto out;
    }
    const curl_version_info_data *vi = curl_version_info(CURLVERSION_NOW);
    if (strcasecmp(scheme, "https") == 0 && !(vi->features & CURL_VERSION_HTTPS_PROXY)) {
        rc =
            sl_err_set(err, SL_EINVAL, "this libcurl (%s) cannot talk TLS to a proxy", vi->version);
        goto out;
    }
    host = get_part(h, CURLUPART_HOST);
    port = get_part(h, CURLUPART_PORT);
    path = get_part(h, CURLUPART_PATH);
    rest = get_part(h, CURLUPART_QUERY);
    if (!rest)
        rest = get_part(h, CURLUPART_FRAGMENT);
    if (!rest)
        rest = get_part(h, CURLUPART_ZONEID);
    if (userinfo_check(h, err) != 0)
        rc = SL_EINVAL;
    else if (!host || !*host)
        rc = sl_err_set(err, SL_EINVAL, "no host");
    else if (port && strspn(port, "0") == strlen(port))
        rc = sl_err_set(err, SL_EINVAL, "the port must be 1..65535");
    else if ((path && strcmp(path, "/") != 0) || rest)
        rc = sl_err_set(err, SL_EINVAL,
                        "nothing may follow host:port (no path, query, fragment or zone id)");
out:
    curl_free(scheme);
    curl_free(host);
    curl_free(port);
    curl_free(path);
    curl_free(rest);
    curl_url_cleanup(h);
    return rc;
}

int sl_url_validate(const char *url, sl_err_t *err)
{
    int rc = check_text(url, err);
    if (rc < 0)
        return rc;
    CURLU *h = curl_url();
    if (!h)
        return sl_err_set(err, SL_ENOMEM, "could not allocate url parser");
    CURLUcode uc = curl_url_set(h, CURLUPART_URL, url, 0);
    if (uc != CURLUE_OK)
        /* curl's message describes the problem, never the input. */
        rc = sl_err_set(err, SL_EINVAL, "url is malformed: %s", curl_url_strerror(uc));
    else
        rc = check_parts(h, err);
    curl_url_cleanup(h);
    return rc;
}
