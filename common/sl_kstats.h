/*
 * sl_kstats: consumer-group lag per partition from librdkafka's statistics, exported as
 * sluice_kafka_consumer_lag_records{topic,partition} (docs/METRICS.md).
 *
 * sl_kstats_enable sets statistics.interval.ms and the statistics callback on a consumer's
 * configuration; the callback (run by librdkafka on the thread that serves the consumer's
 * queue) parses the JSON and replaces that client's rows in a process-wide table, which a
 * collector renders at scrape time. Only partitions assigned to the client (desired) with a
 * known lag are kept.
 *
 * thread: the table is guarded by a mutex; every function may be called from any thread.
 */
#ifndef SL_KSTATS_H
#define SL_KSTATS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

#include "common/sl_err.h"

/* Statistics every interval_ms on conf (before the client is created). */
int sl_kstats_enable(rd_kafka_conf_t *conf, int interval_ms, sl_err_t *err);

/* Parse one statistics document of client `client` (exposed for tests). Returns 0, or -1
 * when json is not a librdkafka statistics object (the table is then unchanged). */
int sl_kstats_update(const char *client, const char *json, size_t len);

/* Sum of the known lags held (all clients), and the rows with a known lag; *known (may be
 * NULL) tells whether any statistics document has been parsed yet (before that, the sum means
 * nothing). */
int64_t sl_kstats_total_lag(size_t *rows, bool *known);

/* Assigned partitions whose lag librdkafka does not know (consumer_lag -1: no committed
 * offset yet, or the broker unreachable): the sum above leaves them out. */
size_t sl_kstats_unknown(void);

/* Drop a client's rows (its handle is being destroyed). */
void sl_kstats_forget(const char *client);

#endif /* SL_KSTATS_H */
