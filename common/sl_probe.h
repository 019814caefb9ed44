/*
 * sl_probe: the metrics listener of a long-running process: GET /metrics (sl_metrics),
 * /healthz (liveness) and /readyz (readiness), served by libmicrohttpd on one thread of its
 * own, so a scrape or a probe never waits on a delivery loop and a stuck loop never stops the
 * probe from saying so. Contract: docs/METRICS.md.
 *
 * Liveness is heartbeats: each loop registers a slot and stamps it every turn (an atomic
 * store); /healthz fails when any registered slot is older than the stall bound. Readiness
 * is the process's callback, called on the listener's thread (it may block briefly, e.g. a
 * PING with a short timeout); it fills a JSON object of named checks.
 */
#ifndef SL_PROBE_H
#define SL_PROBE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include "common/sl_err.h"
#include "common/sl_mem.h"

typedef struct sl_probe sl_probe_t;

/* Fill checks with `"name":"state"` members (comma-separated, no braces) and return whether
 * the process is ready. */
typedef bool (*sl_probe_ready_fn)(void *arg, struct sl_buf *checks);

/* Append one check `"name":"state"` to a readiness callback's checks (name and state are
 * constant words; no escaping). */
void sl_probe_check(struct sl_buf *checks, const char *name, const char *state);

/* Start serving on listen ("host:port", "[v6]:port"); what names the option in errors.
 * stall_ms: the liveness bound. Returns NULL with err filled (bad address, port in use). */
sl_probe_t *sl_probe_start(const char *listen,
                           const char *what,
                           int64_t stall_ms,
                           sl_probe_ready_fn ready,
                           void *arg,
                           sl_err_t *err);
/* Stop serving (waits for a request being answered). NULL-safe. */
void sl_probe_stop(sl_probe_t *p);

/* Heartbeats (process-wide; any thread). A slot is registered by a loop when it starts and
 * released when it ends; at most SL_PROBE_MAX_BEATS at a time. Returns the slot, or -1 when
 * all are taken (that loop then goes unwatched). */
#define SL_PROBE_MAX_BEATS 128
int sl_probe_beat_register(const char *name);
void sl_probe_beat(int slot, int64_t now_mono_ms);
void sl_probe_beat_release(int slot);
/* Whether every registered slot beat within stall_ms of now; when not, name gets the first
 * stalled slot's name (size at least 32). */
bool sl_probe_live(int64_t now_mono_ms, int64_t stall_ms, char *name, size_t name_size);

/* "host:port" or "[v6]:port" -> a passive address for listen(). what names the option. */
int sl_listen_addr(const char *listen,
                   const char *what,
                   struct sockaddr_storage *ss,
                   sl_err_t *err);

#endif /* SL_PROBE_H */
