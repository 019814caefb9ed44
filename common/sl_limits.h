/*
 * sl_limits: the process's open-file limit (RLIMIT_NOFILE) against what a daemon's settings
 * need. Every connection is a file descriptor, and a process that runs out fails its accept()
 * and connect() calls as if the peers were down: libmicrohttpd retries a failing accept in a
 * loop, libcurl reports a connect error that counts against a healthy endpoint's breaker.
 * Hosts often start services with a soft limit of 1,024 (systemd's default) under a much
 * higher hard limit, so at start-up the soft limit is raised to what the settings need, up to
 * the hard limit (as Go's runtime and nginx do); a hard limit below the need is logged once
 * (warn event nofile_limited, naming the setting), and the process runs on.
 */
#ifndef SL_LIMITS_H
#define SL_LIMITS_H

#include <stdint.h>

/* File descriptors kept for everything but client connections: Kafka, Redis and PostgreSQL
 * connections, epoll sets, event fds, logs. */
#define SL_NOFILE_RESERVE 256

/*
 * Make the soft open-file limit at least need (up to the hard limit); when it cannot be, log
 * nofile_limited (module mod) naming setting = value, the setting that asked for it. Returns
 * the soft limit in force afterwards (UINT64_MAX when unlimited), 0 if it cannot be read.
 */
uint64_t sl_nofile_ensure(uint64_t need, const char *mod, const char *setting, int64_t value);

#endif /* SL_LIMITS_H */
