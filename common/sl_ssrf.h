/*
 * sl_ssrf: which addresses a delivery may connect to, and which endpoint URLs are refused
 * before any delivery is made.
 *
 * The consumers check in libcurl's CURLOPT_OPENSOCKETFUNCTION (sl_ssrf_allowed), i.e. on the
 * address actually about to be connected (after DNS, for every happy-eyeballs candidate), so
 * DNS rebinding cannot slip past a check made on the name. Refused: loopback, RFC 1918
 * private, CGNAT 100.64/10, link-local (incl. 169.254.169.254 and fd00:ec2::254), multicast,
 * unspecified, broadcast, benchmarking 198.18/15, reserved 240/4, "this network" 0/8, IETF
 * 192.0.0/24, documentation ranges, IPv6 ULA fc00::/7, site-local fec0::/10, and the IPv4
 * embedded in IPv4-mapped (::ffff:a.b.c.d), IPv4-compatible (::a.b.c.d), NAT64 (64:ff9b::/96
 * and 64:ff9b:1::/48) and 6to4 (2002::/16) forms is checked as IPv4. An allowlist of CIDRs
 * exempts ranges (the tests and the demo deliver to 127.0.0.0/8).
 *
 * The endpoint registry (sluice-api, sluicectl) applies the same policy to a URL whose host
 * says its address without DNS (sl_ssrf_check_host): an IP literal or a name reserved for
 * loopback. Such an endpoint would only ever be refused at delivery, so it is refused when
 * it is registered; a name is left to the delivery-time check, since what it resolves to can
 * change.
 *
 * Through a delivery proxy (delivery_proxy: HTTP CONNECT or socks5h, never socks5) every
 * connection is to the proxy, which resolves and connects: the consumers then check each
 * request's target host as the registry does (sl_ssrf_host_allowed), and what a name
 * resolves to is the proxy's to police.
 *
 * thread: a policy is immutable after parsing and may be shared.
 */
#ifndef SL_SSRF_H
#define SL_SSRF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "common/sl_err.h"

#define SL_SSRF_MAX_ALLOW 32

struct sl_cidr {
    uint8_t addr[16]; /* IPv4 as ::ffff:a.b.c.d (mapped) */
    int prefix;       /* prefix length over the 128-bit form */
};

struct sl_ssrf_policy {
    bool enabled;                            /* false = allow everything */
    struct sl_cidr allow[SL_SSRF_MAX_ALLOW]; /* exempt ranges */
    size_t n_allow;                          /* entries in allow */
};

/* Parse "127.0.0.0/8, ::1/128" (empty = none). Returns 0 or SL_EINVAL naming the entry by
 * its position ("entry 2 (\"x\"): not a CIDR ..."). */
int sl_ssrf_parse(struct sl_ssrf_policy *p, bool enabled, const char *cidrs, sl_err_t *err);

/*
 * May we connect to sa? Returns true when allowed. When refused, *why (optional) gets a
 * static reason ("loopback", "private", "link-local", ...).
 */
bool sl_ssrf_allowed(const struct sl_ssrf_policy *p,
                     const struct sockaddr *sa,
                     socklen_t len,
                     const char **why);

/*
 * Is host (a URL's host as curl normalises it) allowed by what the URL alone says? False
 * for an IP literal or a loopback name the policy refuses (rules as sl_ssrf_check_host),
 * *why (optional) the range's static reason; true for every other name. The consumers apply
 * it, through a delivery proxy, to each new connection's target.
 */
bool sl_ssrf_host_allowed(const struct sl_ssrf_policy *p, const char *host, const char **why);

/*
 * Would the policy refuse every delivery to host (borrowed; a URL's host as curl normalises
 * it: "192.0.2.1", "[::1]" with brackets, "localhost")? Checked: IP literals, and "localhost"
 * and names under ".localhost" (RFC 6761: loopback whatever DNS says) as 127.0.0.1 and ::1
 * (refused when both are). Other
 * names pass: the consumers check what they resolve to at each connection. Returns 0, or
 * SL_EINVAL with a message naming the host, the kind of range and the options that govern it.
 */
int sl_ssrf_check_host(const struct sl_ssrf_policy *p, const char *host, sl_err_t *err);

#endif /* SL_SSRF_H */
