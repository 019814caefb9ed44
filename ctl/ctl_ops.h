/*
 * ctl_ops: what sluicectl's operations commands share (health, slow, dead-letters, alerts,
 * latency in ctl_analysis.c; replay in ctl_replay.c; retries in ctl_retries.c):
 *
 *   - strict parsing of durations ("90m", "24h", "7d") and of points in time (RFC 3339 UTC or
 *     a duration ago), with a pure form for unit tests and a form that reports usage errors;
 *   - the PostgreSQL session of these commands (bounded connect, UTC, statement timeout);
 *   - Kafka consumer-group lag (committed offsets against high watermarks);
 *   - aligned text tables and small formatting helpers.
 *
 * Their Redis state (the retry schedule's counts, the rebuild's writes, breakers) is read and
 * written through common/sl_rstate.h, the layout and scripts the consumer uses too.
 *
 * thread: single-threaded tool.
 */
#ifndef SL_CTL_OPS_H
#define SL_CTL_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>
#include <libpq-fe.h>

#include "common/sl_cfg.h"
#include "common/sl_err.h"

#define CTL_OPS_DUR_MAX_S   (366LL * 86400) /* s; longest accepted window (= SQL's check) */
#define CTL_OPS_EXIT_ALERTS 3               /* `alerts`: at least one alert fires */

/* ==== Durations and times ==== */

/*
 * Parse a duration: a positive decimal integer immediately followed by one unit, s (seconds),
 * m (minutes), h (hours) or d (days): "90m", "24h", "7d". Nothing else: no sign, no space, no
 * fraction, no compound ("1h30m"), no leading zero. Result in seconds, 1..CTL_OPS_DUR_MAX_S.
 * s borrowed. Returns 0 with *out_s set, or SL_EINVAL.
 */
int ctl_ops_duration_parse(const char *s, int64_t *out_s);

/* As ctl_ops_duration_parse, also checking min_s <= result <= max_s; on error prints a usage
 * error for cmd naming flag (never the value) and returns CTL_EXIT_USAGE; 0 on success. */
int ctl_ops_parse_duration(
    const char *cmd, const char *flag, const char *s, int64_t min_s, int64_t max_s, int64_t *out_s);

/* Format seconds as the shortest exact duration ("1d", "90m", "45s") into out (>= 24 B). */
void ctl_ops_duration_format(int64_t secs, char *out, size_t outlen);

/*
 * Parse a point in time: RFC 3339 in UTC or with an offset, seconds required, fraction
 * optional ("2026-11-30T13:45:01Z", "2026-11-30T13:45:01.250+02:00", 'T' or ' ' between date
 * and time), or a duration (as above) meaning that long before now_ms ("2h" = 2 hours ago).
 * Returns 0 with *out_ms (unix ms) set, or SL_EINVAL.
 */
int ctl_ops_time_parse(const char *s, int64_t now_ms, int64_t *out_ms);

/* Format unix ms as "2026-11-30T13:45:01.250Z" into out (>= 32 bytes). */
void ctl_ops_fmt_ms(int64_t ms, char *out, size_t outlen);

/* ==== PostgreSQL ==== */

/*
 * Connect with cfg->pg_dsn: connect_timeout 5 s and application_name "sluicectl" unless the DSN
 * sets them; then the session settings every operations query assumes: TimeZone UTC,
 * DateStyle ISO, statement_timeout 60 s, lock_timeout 30 s. Returns the connection (caller
 * PQfinish) or NULL with err (SL_EPG; never the password).
 */
PGconn *ctl_ops_pg_open(const struct sl_config *cfg, sl_err_t *err);

/* ==== Kafka consumer-group lag ==== */

struct ctl_ops_lag_part {
    int32_t partition; /* partition id */
    int64_t committed; /* committed offset of the group; -1 = none committed yet */
    int64_t low;       /* low watermark (oldest retained offset) */
    int64_t high;      /* high watermark (next offset to be written) */
    int64_t lag;       /* records not yet consumed: high - committed, or high - low when
                          nothing is committed (the group starts from the earliest) */
};

struct ctl_ops_lag {
    int64_t total;                 /* sum of the partitions' lag, records */
    int n;                         /* partitions */
    int uncommitted;               /* partitions holding records but no committed offset */
    struct ctl_ops_lag_part *part; /* n entries (owned; ctl_ops_lag_fini frees) */
};

/*
 * Lag of consumer group `group` on `topic` (strings borrowed): committed offsets
 * (rd_kafka_committed) against watermarks (rd_kafka_query_watermark_offsets). Does not join
 * the group or commit anything. timeout_ms bounds each broker request. out: OUT, owned by the
 * caller (ctl_ops_lag_fini), zeroed on failure. Returns 0 or SL_EKAFKA / SL_ENOTFOUND (topic
 * missing) with err.
 */
int ctl_ops_kafka_lag(const struct sl_config *cfg,
                      const char *group,
                      const char *topic,
                      int timeout_ms,
                      struct ctl_ops_lag *out,
                      sl_err_t *err);
void ctl_ops_lag_fini(struct ctl_ops_lag *l);

/* ==== Text tables ==== */

/* A table of strings printed with aligned columns. */
struct ctl_table {
    size_t ncols;            /* columns */
    const char *const *head; /* ncols headers (borrowed) */
    const char *align;       /* ncols characters: 'l' or 'r' (borrowed) */
    char **cells;            /* ncells strings, row-major (owned) */
    size_t ncells;           /* cells added so far */
    size_t cap;              /* capacity of cells */
};

/* head: ncols headers; align: string of ncols 'l'/'r'. Both borrowed for the table's life. */
void ctl_table_init(struct ctl_table *t, size_t ncols, const char *const *head, const char *align);
/* Append one cell (printf-style; rows fill left to right). */
void ctl_table_add(struct ctl_table *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Print with two spaces between columns, each line prefixed by indent spaces. */
void ctl_table_print(const struct ctl_table *t, FILE *f, int indent);
void ctl_table_fini(struct ctl_table *t);

/* Print a jansson value (indented, key order kept) and a newline to stdout; consumes j. */
void ctl_ops_print_json(json_t *j);

#endif /* SL_CTL_OPS_H */
