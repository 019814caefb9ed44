/*
 * sl_ssrf: address policy (see sl_ssrf.h). Everything is normalised to a 16-byte IPv6
 * form first (IPv4 as ::ffff:a.b.c.d), embedded IPv4 forms are unwrapped, then the address
 * is matched against the allowlist and the table of non-global ranges.
 */
#include "common/sl_ssrf.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const uint8_t v4mapped_prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

static bool prefix_match(const uint8_t *a, const uint8_t *net, int prefix)
{
    int full = prefix / 8, rem = prefix % 8;
    if (memcmp(a, net, (size_t)full) != 0)
        return false;
    if (rem == 0)
        return true;
    uint8_t mask = (uint8_t)(0xff << (8 - rem));
    return (a[full] & mask) == (net[full] & mask);
}

static void set_v4(uint8_t out[16], uint32_t v4_host_order)
{
    memcpy(out, v4mapped_prefix, 12);
    out[12] = (uint8_t)(v4_host_order >> 24);
    out[13] = (uint8_t)(v4_host_order >> 16);
    out[14] = (uint8_t)(v4_host_order >> 8);
    out[15] = (uint8_t)v4_host_order;
}

/* Unwrap IPv4 embedded in IPv6 forms; returns true if out now holds a mapped IPv4. */
static bool unwrap_v4(uint8_t a[16])
{
    static const uint8_t nat64[12] = {0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0};
    static const uint8_t zero12[12] = {0};
    if (memcmp(a, v4mapped_prefix, 12) == 0)
        return true;
    uint8_t v4[4];
    if (memcmp(a, nat64, 12) == 0 || (memcmp(a, zero12, 12) == 0 && (a[12] | a[13] | a[14]) != 0)) {
        /* 64:ff9b::/96 NAT64 and ::a.b.c.d IPv4-compatible (not :: or ::1) */
        memcpy(v4, a + 12, 4);
    } else if (a[0] == 0x20 && a[1] == 0x02) {
        /* 6to4 2002:a.b.c.d::/48 */
        memcpy(v4, a + 2, 4);
    } else {
        /* no IPv4 inside; 64:ff9b:1::/48 local-use NAT64 (RFC 8215) included: its mapping
         * is site-local, so the address is treated as non-global outright */
        return false;
    }
    memcpy(a, v4mapped_prefix, 12);
    memcpy(a + 12, v4, 4);
    return true;
}

struct range {
    const char *cidr; /* textual, parsed once */
    const char *why;  /* reason */
};

static const struct range denied[] = {
    {"0.0.0.0/8", "this-network"},
    {"10.0.0.0/8", "private"},
    {"100.64.0.0/10", "shared-cgnat"},
    {"127.0.0.0/8", "loopback"},
    {"169.254.0.0/16", "link-local"},
    {"172.16.0.0/12", "private"},
    {"192.0.0.0/24", "ietf-reserved"},
    {"192.0.2.0/24", "documentation"},
    {"192.88.99.0/24", "6to4-relay"},
    {"192.168.0.0/16", "private"},
    {"198.18.0.0/15", "benchmarking"},
    {"198.51.100.0/24", "documentation"},
    {"203.0.113.0/24", "documentation"},
    {"224.0.0.0/4", "multicast"},
    {"240.0.0.0/4", "reserved"},
    {"::/128", "unspecified"},
    {"::1/128", "loopback"},
    {"64:ff9b:1::/48", "nat64-local"},
    {"100::/64", "discard"},
    {"2001:db8::/32", "documentation"},
    {"fc00::/7", "unique-local"},
    {"fe80::/10", "link-local"},
    {"fec0::/10", "site-local"},
    {"ff00::/8", "multicast"},
};

static int parse_cidr(const char *s, struct sl_cidr *out)
{
    char buf[80];
    size_t n = strlen(s);
    if (n == 0 || n >= sizeof(buf))
        return -1;
    memcpy(buf, s, n + 1);
    char *slash = strchr(buf, '/');
    long prefix = -1;
    if (slash) {
        *slash = '\0';
        char *end;
        prefix = strtol(slash + 1, &end, 10);
        if (*end || end == slash + 1)
            return -1;
    }
    struct in_addr v4;
    struct in6_addr v6;
    if (inet_pton(AF_INET, buf, &v4) == 1) {
        if (prefix < 0)
            prefix = 32;
        if (prefix > 32)
            return -1;
        set_v4(out->addr, ntohl(v4.s_addr));
        out->prefix = (int)prefix + 96;
    } else if (inet_pton(AF_INET6, buf, &v6) == 1) {
        if (prefix < 0)
            prefix = 128;
        if (prefix > 128)
            return -1;
        memcpy(out->addr, v6.s6_addr, 16);
        out->prefix = (int)prefix;
    } else {
        return -1;
    }
    return 0;
}

int sl_ssrf_parse(struct sl_ssrf_policy *p, bool enabled, const char *cidrs, sl_err_t *err)
{
    memset(p, 0, sizeof(*p));
    p->enabled = enabled;
    const char *s = cidrs ? cidrs : "";
    int idx = 0;
    while (*s) {
        while (*s == ' ' || *s == ',')
            s++;
        if (!*s)
            break;
        const char *e = s;
        while (*e && *e != ',' && *e != ' ')
            e++;
        char one[80];
        size_t n = (size_t)(e - s);
        idx++;
        if (n >= sizeof(one) || p->n_allow == SL_SSRF_MAX_ALLOW)
            return sl_err_set(err, SL_EINVAL, "entry %d: too long, or more than %d entries", idx,
                              SL_SSRF_MAX_ALLOW);
        memcpy(one, s, n);
        one[n] = '\0';
        if (parse_cidr(one, &p->allow[p->n_allow]) != 0)
            return sl_err_set(err, SL_EINVAL, "entry %d (\"%s\"): not a CIDR (address/prefix)", idx,
                              one);
        p->n_allow++;
        s = e;
    }
    return 0;
}

bool sl_ssrf_allowed(const struct sl_ssrf_policy *p,
                     const struct sockaddr *sa,
                     socklen_t len,
                     const char **why)
{
    uint8_t a[16];
    if (why)
        *why = NULL;
    if (sa->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)(const void *)sa;
        set_v4(a, ntohl(s4->sin_addr.s_addr));
    } else if (sa->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)(const void *)sa;
        memcpy(a, s6->sin6_addr.s6_addr, 16);
    } else {
        if (why)
            *why = "unsupported-address-family";
        return !p->enabled;
    }
    if (!p->enabled)
        return true;
    uint8_t raw[16];
    memcpy(raw, a, 16);
    bool is_v4 = unwrap_v4(a);
    for (size_t i = 0; i < p->n_allow; i++) {
        if (prefix_match(a, p->allow[i].addr, p->allow[i].prefix) ||
            prefix_match(raw, p->allow[i].addr, p->allow[i].prefix))
            return true;
    }
    if (is_v4 && a[12] == 255 && a[13] == 255 && a[14] == 255 && a[15] == 255) {
        if (why)
            *why = "broadcast";
        return false;
    }
    for (size_t i = 0; i < sizeof(denied) / sizeof(denied[0]); i++) {
        struct sl_cidr c;
        if (parse_cidr(denied[i].cidr, &c) != 0)
            continue;
        if (prefix_match(a, c.addr, c.prefix) || prefix_match(raw, c.addr, c.prefix)) {
            if (why)
                *why = denied[i].why;
            return false;
        }
    }
    return true;
}

/* "localhost", "LOCALHOST.", "a.localhost": names RFC 6761 reserves for loopback. */
static bool loopback_name(const char *host)
{
    size_t n = strlen(host);
    if (n > 0 && host[n - 1] == '.')
        n--;
    static const char suffix[] = "localhost";
    const size_t sn = sizeof(suffix) - 1;
    if (n < sn || strncasecmp(host + n - sn, suffix, sn) != 0)
        return false;
    return n == sn || host[n - sn - 1] == '.';
}

/* "192.0.2.1" or "192.0.2.1." (one trailing dot, as a name may end: a proxy that drops it
 * would connect to the address) as an IPv4 address. */
static bool v4_literal(const char *host, struct in_addr *out)
{
    char lit[INET_ADDRSTRLEN + 1];
    size_t n = strlen(host);
    if (n > 0 && host[n - 1] == '.')
        n--;
    if (n == 0 || n >= sizeof(lit))
        return false;
    memcpy(lit, host, n);
    lit[n] = '\0';
    return inet_pton(AF_INET, lit, out) == 1;
}

/* A host curl left as a name that a resolver or a proxy may still read as an IPv4 number:
 * "127.1.", "2130706433.", "0x7f.0.0.1." (a digit first, then digits, hex digits, x and
 * dots only). No registered name looks like that. */
static bool numeric_looking(const char *host)
{
    if (host[0] < '0' || host[0] > '9')
        return false;
    return host[strspn(host, "0123456789abcdefABCDEFxX.")] == '\0';
}

bool sl_ssrf_host_allowed(const struct sl_ssrf_policy *p, const char *host, const char **why)
{
    if (why)
        *why = NULL;
    if (!p->enabled || !host)
        return true;
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof(ss));
    socklen_t len;
    char lit[64];
    size_t n = strlen(host);
    struct sockaddr_in *s4 = (struct sockaddr_in *)(void *)&ss;
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)(void *)&ss;
    bool name = loopback_name(host);
    if (n >= 2 && host[0] == '[' && host[n - 1] == ']' && n - 2 < sizeof(lit)) {
        memcpy(lit, host + 1, n - 2);
        lit[n - 2] = '\0';
        if (inet_pton(AF_INET6, lit, &s6->sin6_addr) != 1)
            return true; /* not an address curl would connect to as written */
        s6->sin6_family = AF_INET6;
        len = sizeof(*s6);
    } else if (name || v4_literal(host, &s4->sin_addr)) {
        if (name)
            s4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        s4->sin_family = AF_INET;
        len = sizeof(*s4);
    } else if (numeric_looking(host)) {
        if (why)
            *why = "numeric-host";
        return false;
    } else {
        return true;
    }
    if (sl_ssrf_allowed(p, (const struct sockaddr *)&ss, len, why))
        return true;
    if (name) { /* it may resolve to ::1 too: refused only if both are */
        struct sockaddr_in6 lo6;
        memset(&lo6, 0, sizeof(lo6));
        lo6.sin6_family = AF_INET6;
        lo6.sin6_addr = in6addr_loopback;
        if (sl_ssrf_allowed(p, (const struct sockaddr *)&lo6, sizeof(lo6), NULL))
            return true;
    }
    return false;
}

int sl_ssrf_check_host(const struct sl_ssrf_policy *p, const char *host, sl_err_t *err)
{
    const char *why = NULL;
    if (sl_ssrf_host_allowed(p, host, &why))
        return 0;
    if (why && strcmp(why, "numeric-host") == 0)
        return sl_err_set(err, SL_EINVAL,
                          "host %s reads as a number but not as an IP address as written: "
                          "write the address in dotted-decimal form (ssrf_protection)",
                          host);
    return sl_err_set(err, SL_EINVAL,
                      "host %s is a non-global address (%s), where the consumers refuse to "
                      "deliver (ssrf_protection); to allow it, add its range to "
                      "ssrf_allow_cidrs here and in the consumers' configuration",
                      host, why ? why : "unsupported");
}
