/*
 * sl_cfg: the option table and its loader (see sl_cfg.h).
 *
 * Loading is two-phase: every key is parsed and range-checked on its own, and only then do
 * cross-field checks run (finalize), so one run reports every problem. Nothing here connects
 * to anything.
 */
#include "common/sl_cfg.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <libpq-fe.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "common/sl_err.h"
#include "common/sl_hex.h"
#include "common/sl_log.h"
#include "common/sl_mem.h"
#include "common/sl_record.h"
#include "common/sl_redis.h"
#include "common/sl_secretbox.h"
#include "common/sl_ssrf.h"
#include "common/sl_url.h"

extern char **environ;

enum opt_type { T_STR, T_INT, T_BOOL };

#define F_SECRET 0x1u /* value never printed */
#define F_DSN    0x2u /* libpq conninfo: mask password=... */
#define F_URL    0x4u /* URL: mask userinfo password */

struct opt {
    const char *name;   /* key in config files */
    const char *env;    /* environment variable */
    enum opt_type type; /* value type */
    size_t off;         /* offsetof(struct sl_config, field) */
    int64_t min, max;   /* bounds for T_INT (inclusive) */
    const char *def;    /* default as text */
    unsigned flags;     /* F_* */
    const char *help;   /* one line */
};

#define O(field) offsetof(struct sl_config, field)
#define S(n, e, f, d, fl, h)                                                                       \
    {                                                                                              \
        n, e, T_STR, O(f), 0, 0, d, fl, h                                                          \
    }
#define I(n, e, f, lo, hi, d, h)                                                                   \
    {                                                                                              \
        n, e, T_INT, O(f), lo, hi, d, 0, h                                                         \
    }
#define B(n, e, f, d, h)                                                                           \
    {                                                                                              \
        n, e, T_BOOL, O(f), 0, 1, d, 0, h                                                          \
    }

static const struct opt opts[] = {
    S("kafka_brokers",
      "SLUICE_KAFKA_BROKERS",
      kafka_brokers,
      "127.0.0.1:19092",
      0,
      "Kafka bootstrap servers (host:port,...)"),
    S("topic_deliveries",
      "SLUICE_TOPIC_DELIVERIES",
      topic_deliveries,
      "sluice.deliveries",
      0,
      "topic of delivery records (key = endpoint id)"),
    S("topic_outcomes",
      "SLUICE_TOPIC_OUTCOMES",
      topic_outcomes,
      "sluice.outcomes",
      0,
      "topic of outcome records (one per attempt or state change)"),
    S("topic_quarantine",
      "SLUICE_TOPIC_QUARANTINE",
      topic_quarantine,
      "sluice.quarantine",
      0,
      "topic for undecodable or invalid records, with the reason"),
    S("topic_endpoints",
      "SLUICE_TOPIC_ENDPOINTS",
      topic_endpoints,
      "sluice.endpoints",
      0,
      "compacted topic of endpoint records"),
    S("consumer_group",
      "SLUICE_CONSUMER_GROUP",
      consumer_group,
      "sluice-consumers",
      0,
      "consumer group of sluice-consumer"),
    S("recorder_group",
      "SLUICE_RECORDER_GROUP",
      recorder_group,
      "sluice-recorder",
      0,
      "consumer group of sluice-recorder"),
    I("kafka_session_timeout_ms",
      "SLUICE_KAFKA_SESSION_TIMEOUT_MS",
      kafka_session_timeout_ms,
      3000,
      300000,
      "45000",
      "consumer group session timeout (ms)"),
    I("kafka_fetch_wait_ms",
      "SLUICE_KAFKA_FETCH_WAIT_MS",
      kafka_fetch_wait_ms,
      1,
      10000,
      "10",
      "longest a broker holds a fetch for kafka_fetch_min_bytes to arrive (ms): the latency a "
      "quiet topic adds before a record is seen"),
    I("kafka_fetch_min_bytes",
      "SLUICE_KAFKA_FETCH_MIN_BYTES",
      kafka_fetch_min_bytes,
      1,
      16777216,
      "65536",
      "bytes a fetch waits for (up to kafka_fetch_wait_ms); 1 answers every fetch at once, "
      "which at moderate rates means one fetch per produced batch and a busy broker"),
    I("consumer_prefetch_kb",
      "SLUICE_CONSUMER_PREFETCH_KB",
      consumer_prefetch_kb,
      1024,
      262144,
      "8192",
      "records each sluice-consumer delivery loop pre-fetches from Kafka, in KiB "
      "(queued.max.messages.kbytes), on top of its jobs in memory; it also bounds the loop's "
      "intake: once this queue is full, librdkafka 2.0.2 fetches again only when its broker "
      "thread next wakes (up to a second), so the queue should hold about a second of the "
      "loop's deliveries. One loop reading one partition on a 2-vCPU host: 7,953-7,959/s at "
      "4096, 13,236-14,713 at 8192 (bench/results/2026-12-05-intel-prefetch-ab.txt)"),
    S("kafka_security_protocol",
      "SLUICE_KAFKA_SECURITY_PROTOCOL",
      kafka_security_protocol,
      "PLAINTEXT",
      0,
      "how every Kafka client of every process talks to the brokers: PLAINTEXT, SSL (TLS), "
      "SASL_SSL (TLS plus SASL authentication) or SASL_PLAINTEXT (SASL without TLS: the "
      "password is protected only by SCRAM, PLAIN sends it in the clear)"),
    S("kafka_sasl_mechanism",
      "SLUICE_KAFKA_SASL_MECHANISM",
      kafka_sasl_mechanism,
      "SCRAM-SHA-512",
      0,
      "SASL mechanism with SASL_SSL or SASL_PLAINTEXT: SCRAM-SHA-512, SCRAM-SHA-256 or PLAIN. "
      "librdkafka 2.0.2 (Debian 12) answers SCRAM in a way Kafka 4 brokers refuse "
      "(docs/OPERATIONS.md, \"Security\"): against those use PLAIN over SASL_SSL or client "
      "certificates"),
    S("kafka_sasl_username",
      "SLUICE_KAFKA_SASL_USERNAME",
      kafka_sasl_username,
      "",
      0,
      "SASL user name (required with SASL_SSL and SASL_PLAINTEXT, refused otherwise)"),
    S("kafka_sasl_password",
      "SLUICE_KAFKA_SASL_PASSWORD",
      kafka_sasl_password,
      "",
      F_SECRET,
      "SASL password (required with SASL_SSL and SASL_PLAINTEXT, refused otherwise)"),
    S("kafka_ssl_ca_file",
      "SLUICE_KAFKA_SSL_CA_FILE",
      kafka_ssl_ca_file,
      "",
      0,
      "PEM file of the CA certificates that verify the brokers' certificates with SSL and "
      "SASL_SSL (empty = the system's trust store); broker host names are always checked "
      "against the certificate"),
    S("kafka_ssl_cert_file",
      "SLUICE_KAFKA_SSL_CERT_FILE",
      kafka_ssl_cert_file,
      "",
      0,
      "PEM client certificate for brokers that require one (mutual TLS, SSL or SASL_SSL); "
      "needs kafka_ssl_key_file"),
    S("kafka_ssl_key_file",
      "SLUICE_KAFKA_SSL_KEY_FILE",
      kafka_ssl_key_file,
      "",
      0,
      "PEM private key of kafka_ssl_cert_file (encrypted keys need kafka_ssl_key_password)"),
    S("kafka_ssl_key_password",
      "SLUICE_KAFKA_SSL_KEY_PASSWORD",
      kafka_ssl_key_password,
      "",
      F_SECRET,
      "passphrase of an encrypted kafka_ssl_key_file"),
    S("redis_url",
      "SLUICE_REDIS_URL",
      redis_url,
      "redis://127.0.0.1:16379",
      F_URL,
      "Redis URL redis://[[user]:password@]host:port[/db], or for a Redis Cluster "
      "redis-cluster://[[user]:password@]host:port[,host:port...] (seed nodes, at most 16; "
      "the slot map is read from them, database 0 only): with a user, AUTH user password "
      "(a Redis 6+ ACL user), otherwise AUTH password; user and password may be "
      "percent-encoded; no TLS (docs/OPERATIONS.md, \"Security\"); the password is redacted "
      "in output"),
    I("redis_timeout_ms",
      "SLUICE_REDIS_TIMEOUT_MS",
      redis_timeout_ms,
      10,
      60000,
      "2000",
      "Redis connect and command timeout (ms)"),
    S("pg_dsn",
      "SLUICE_PG_DSN",
      pg_dsn,
      "host=127.0.0.1 port=15432 dbname=sluice user=sluice",
      F_DSN,
      "PostgreSQL libpq connection string (password redacted in output)"),
    S("master_key",
      "SLUICE_MASTER_KEY",
      master_key,
      "",
      F_SECRET,
      "master keys [id:]key,... (32 bytes as 64 hex chars or base64; the first seals secrets "
      "and signs endpoint records, the others only open and verify: rotation)"),
    S("log_level", "SLUICE_LOG_LEVEL", log_level, "info", 0, "error, warn, info or debug"),
    S("debug",
      "SLUICE_DEBUG",
      debug,
      "",
      0,
      "debug contexts with log_level=debug: kafka,http,redis,db,cfg or all"),
    S("instance_id",
      "SLUICE_INSTANCE_ID",
      instance_id,
      "",
      0,
      "this process's id in outcomes and leases: 1..64 visible ASCII characters (empty = "
      "hostname-pid)"),
    I("http_timeout_ms",
      "SLUICE_HTTP_TIMEOUT_MS",
      http_timeout_ms,
      100,
      600000,
      "15000",
      "total request timeout (ms)"),
    I("http_connect_timeout_ms",
      "SLUICE_HTTP_CONNECT_TIMEOUT_MS",
      http_connect_timeout_ms,
      10,
      600000,
      "5000",
      "connect timeout including TLS (ms)"),
    I("consumer_threads",
      "SLUICE_CONSUMER_THREADS",
      consumer_threads,
      1,
      64,
      "1",
      "delivery loops (threads) per consumer process, each a consumer-group member of its "
      "own with its share of the partitions, its own HTTP connections and Redis connection; "
      "max_inflight and max_queued stay per process (split evenly between the loops, "
      "rounded up), endpoint_backlog and the per-endpoint caps hold per loop as they hold "
      "per process (an endpoint's records are read by one loop)"),
    I("max_inflight",
      "SLUICE_MAX_INFLIGHT",
      max_inflight,
      1,
      100000,
      "2000",
      "global cap on concurrent requests per consumer process"),
    B("adaptive_inflight",
      "SLUICE_ADAPTIVE_INFLIGHT",
      adaptive_inflight,
      "true",
      "while a delivery loop is saturated (waiting in epoll under 10% of its time, at least "
      "16 answers per loop turn) with at least 128 requests out, it lowers the cap it sends "
      "under every 100 ms to 3/4 of what is in flight, down to 128 requests: answers no "
      "longer wait in their sockets for the loop, and libcurl's CPU per request, which grows "
      "with the transfers it holds, falls; once the loop waits 25% of its time with that cap "
      "holding back an endpoint, the cap grows by half per 100 ms, back to the loop's share of "
      "max_inflight. A share of 128 or less never moves. false = the cap is always the "
      "loop's share of max_inflight"),
    I("max_inflight_per_endpoint",
      "SLUICE_MAX_INFLIGHT_PER_ENDPOINT",
      max_inflight_per_endpoint,
      1,
      10000,
      "64",
      "default cap on concurrent requests to one endpoint"),
    I("max_queued",
      "SLUICE_MAX_QUEUED",
      max_queued,
      100,
      1000000,
      "5000",
      "jobs held in memory beyond max_inflight (queued to send, waiting for an outcome's "
      "acknowledgement); at max_inflight + max_queued a loop takes no more Kafka records "
      "until answers make room (they wait in its pre-fetch queue), and after a second "
      "without room it pauses its partitions until below max_inflight + max_queued / 2 "
      "(with consumer_threads > 1, each loop at its share); the queues of endpoints that "
      "are not keeping up (head waiting 2 s, the endpoint held back or silent) are then moved "
      "to the Redis schedule"),
    I("endpoint_backlog",
      "SLUICE_ENDPOINT_BACKLOG",
      endpoint_backlog,
      1,
      1000000,
      "2000",
      "deliveries queued in memory per endpoint before spilling to the Redis schedule"),
    I("max_body_bytes",
      "SLUICE_MAX_BODY_BYTES",
      max_body_bytes,
      1,
      16777216,
      "1048576",
      "largest delivery body accepted (bytes)"),
    I("response_keep_bytes",
      "SLUICE_RESPONSE_KEEP_BYTES",
      response_keep_bytes,
      0,
      65536,
      "4096",
      "response body prefix kept in outcome records (bytes)"),
    I("response_max_bytes",
      "SLUICE_RESPONSE_MAX_BYTES",
      response_max_bytes,
      1,
      67108864,
      "1048576",
      "response bodies longer than this abort the transfer (bytes)"),
    B("ssrf_protection",
      "SLUICE_SSRF_PROTECTION",
      ssrf_protection,
      "true",
      "refuse to connect to loopback, private, link-local and other non-global addresses, and "
      "to register an endpoint whose host is one"),
    S("ssrf_allow_cidrs",
      "SLUICE_SSRF_ALLOW_CIDRS",
      ssrf_allow_cidrs,
      "",
      0,
      "comma-separated CIDRs exempt from SSRF refusal, at delivery and at registration (e.g. "
      "127.0.0.0/8 for local demos)"),
    S("delivery_proxy",
      "SLUICE_DELIVERY_PROXY",
      delivery_proxy,
      "",
      F_URL,
      "proxy every delivery is tunnelled through (CONNECT; http://, https:// or "
      "socks5h://host:port, user:password@ allowed), e.g. an egress proxy with fixed addresses "
      "that endpoints allow (empty = connect directly); the consumers then connect to nothing "
      "else, and an endpoint whose host is a refused address is still refused"),
    S("delivery_proxy_ca_file",
      "SLUICE_DELIVERY_PROXY_CA_FILE",
      delivery_proxy_ca_file,
      "",
      0,
      "PEM file of the CA certificates that verify an https:// delivery_proxy's own "
      "certificate, in place of the system's trust store (empty = the system's); only with an "
      "https:// delivery_proxy. The endpoints' certificates are endpoint_ca_file's"),
    S("endpoint_ca_file",
      "SLUICE_ENDPOINT_CA_FILE",
      endpoint_ca_file,
      "",
      0,
      "PEM file of the CA certificates that verify HTTPS endpoints' certificates, in place of "
      "the system's trust store (empty = the system's); to trust both, give a file holding "
      "both. Host names are always checked against the certificate"),
    I("retry_base_ms",
      "SLUICE_RETRY_BASE_MS",
      retry_base_ms,
      1,
      86400000,
      "30000",
      "full-jitter backoff base (ms)"),
    I("retry_cap_ms",
      "SLUICE_RETRY_CAP_MS",
      retry_cap_ms,
      1,
      604800000,
      "3600000",
      "maximum backoff delay (ms)"),
    I("max_attempts",
      "SLUICE_MAX_ATTEMPTS",
      max_attempts,
      1,
      100,
      "5",
      "attempts before a delivery becomes a dead letter"),
    I("retry_shards",
      "SLUICE_RETRY_SHARDS",
      retry_shards,
      1,
      1024,
      "16",
      "number of Redis retry sorted sets (hash-tagged shards)"),
    I("lease_ms",
      "SLUICE_LEASE_MS",
      lease_ms,
      1000,
      3600000,
      "60000",
      "lease on a claimed retry job; must exceed http_timeout_ms"),
    I("retry_after_max_ms",
      "SLUICE_RETRY_AFTER_MAX_MS",
      retry_after_max_ms,
      0,
      86400000,
      "3600000",
      "largest Retry-After honoured (ms)"),
    I("breaker_threshold",
      "SLUICE_BREAKER_THRESHOLD",
      breaker_threshold,
      1,
      100000,
      "10",
      "consecutive failures that open an endpoint's breaker"),
    I("breaker_slow_threshold",
      "SLUICE_BREAKER_SLOW_THRESHOLD",
      breaker_slow_threshold,
      1,
      100000,
      "3",
      "breaker threshold for endpoints whose P95 latency is slow"),
    I("breaker_slow_p95_ms",
      "SLUICE_BREAKER_SLOW_P95_MS",
      breaker_slow_p95_ms,
      1,
      600000,
      "5000",
      "P95 latency above which the slow threshold applies (ms)"),
    I("breaker_cooldown_ms",
      "SLUICE_BREAKER_COOLDOWN_MS",
      breaker_cooldown_ms,
      10,
      86400000,
      "300000",
      "first breaker cooldown (ms)"),
    I("breaker_cooldown_max_ms",
      "SLUICE_BREAKER_COOLDOWN_MAX_MS",
      breaker_cooldown_max_ms,
      10,
      604800000,
      "3600000",
      "cap of the doubled breaker cooldown (ms)"),
    I("disable_after_ms",
      "SLUICE_DISABLE_AFTER_MS",
      disable_after_ms,
      0,
      31536000000LL,
      "432000000",
      "disable an endpoint once its breaker has been open this long, every probe failing "
      "(0 = never; 410 always disables)"),
    I("dedup_window_s",
      "SLUICE_DEDUP_WINDOW_S",
      dedup_window_s,
      1,
      2592000,
      "86400",
      "how long a delivered marker suppresses duplicates (s)"),
    B("dedup_fail_open",
      "SLUICE_DEDUP_FAIL_OPEN",
      dedup_fail_open,
      "true",
      "when the duplicate check cannot reach Redis, deliver anyway (true: at-least-once, "
      "endpoints keep receiving; false: hold the records and pause intake until Redis "
      "answers, so a rebalance during an outage does not resend work)"),
    I("shutdown_drain_ms",
      "SLUICE_SHUTDOWN_DRAIN_MS",
      shutdown_drain_ms,
      0,
      600000,
      "10000",
      "on SIGTERM, time allowed for in-flight requests to finish (ms)"),
    I("shutdown_timeout_ms",
      "SLUICE_SHUTDOWN_TIMEOUT_MS",
      shutdown_timeout_ms,
      5000,
      600000,
      "25000",
      "on SIGTERM, the bound on the whole exit of sluice-consumer and sluice-recorder (ms): "
      "drain, flush, commit and leaving the group, whatever service is down; keep it below "
      "the orchestrator's grace period (Kubernetes: 30 s)"),
    I("recorder_batch",
      "SLUICE_RECORDER_BATCH",
      recorder_batch,
      1,
      1000000,
      "20000",
      "outcome rows per batch (split over the lanes, one transaction each); a partial batch "
      "is written after recorder_flush_ms"),
    I("recorder_flush_ms",
      "SLUICE_RECORDER_FLUSH_MS",
      recorder_flush_ms,
      1,
      60000,
      "500",
      "flush a partial batch after this long (ms)"),
    I("recorder_future_max_s",
      "SLUICE_RECORDER_FUTURE_MAX_S",
      recorder_future_max_s,
      1,
      31536000,
      "600",
      "an outcome stamped further ahead of PostgreSQL's clock than this is quarantined, not "
      "recorded: a pod whose clock runs ahead would otherwise hold its endpoint's latest-outcome "
      "health until that time (s)"),
    I("recorder_lanes",
      "SLUICE_RECORDER_LANES",
      recorder_lanes,
      1,
      SL_CFG_RECORDER_LANES_MAX,
      "2",
      "parallel write lanes of the recorder (one PostgreSQL connection each)"),
    I("recorder_batch_max_bytes",
      "SLUICE_RECORDER_BATCH_MAX_BYTES",
      recorder_batch_max_bytes,
      1048576,
      1073741824,
      "67108864",
      "encoded bytes that make a recorder batch full, per batch (bytes)"),
    I("recorder_health_refresh_ms",
      "SLUICE_RECORDER_HEALTH_REFRESH_MS",
      recorder_health_refresh_ms,
      1000,
      3600000,
      "30000",
      "endpoint_health statistics refresh interval, at least (ms)"),
    I("latency_window_h",
      "SLUICE_LATENCY_WINDOW_H",
      latency_window_h,
      1,
      720,
      "24",
      "rolling window of latency samples (hours)"),
    I("dead_letter_retention_d",
      "SLUICE_DEAD_LETTER_RETENTION_D",
      dead_letter_retention_d,
      1,
      3650,
      "30",
      "dead letters (with payloads) kept this many days"),
    I("history_retention_d",
      "SLUICE_HISTORY_RETENTION_D",
      history_retention_d,
      1,
      3650,
      "14",
      "delivery_attempts partitions kept this many days"),
    I("deliveries_retention_d",
      "SLUICE_DELIVERIES_RETENTION_D",
      deliveries_retention_d,
      0,
      3650,
      "0",
      "deliveries rows (latest state per event and endpoint) kept this many days after their "
      "last update; 0 = history_retention_d (rows an unresolved dead letter refers to stay)"),
    S("api_listen",
      "SLUICE_API_LISTEN",
      api_listen,
      "127.0.0.1:8088",
      0,
      "sluice-api: address to listen on (host:port; IPv6 as [addr]:port)"),
    I("api_threads",
      "SLUICE_API_THREADS",
      api_threads,
      1,
      64,
      "2",
      "sluice-api: HTTP loop threads (each serves many connections)"),
    I("api_read_threads",
      "SLUICE_API_READ_THREADS",
      api_read_threads,
      1,
      64,
      "2",
      "sluice-api: threads running the delivery log's reads (each with its PostgreSQL "
      "connection), so that a slow history query never holds an HTTP loop and its publishes"),
    I("api_max_connections",
      "SLUICE_API_MAX_CONNECTIONS",
      api_max_connections,
      1,
      65536,
      "1024",
      "sluice-api: open client connections served at once (one past it waits, not accepted, until "
      "one closes)"),
    I("api_idle_timeout_s",
      "SLUICE_API_IDLE_TIMEOUT_S",
      api_idle_timeout_s,
      1,
      3600,
      "30",
      "sluice-api: a connection idle, or stalled mid-request, this long is closed (s)"),
    I("api_request_timeout_s",
      "SLUICE_API_REQUEST_TIMEOUT_S",
      api_request_timeout_s,
      1,
      3600,
      "60",
      "sluice-api: a connection must send each whole request (headers and body) within this "
      "long of opening or of its previous answer, else it is closed (s; slow clients)"),
    I("api_max_request_bytes",
      "SLUICE_API_MAX_REQUEST_BYTES",
      api_max_request_bytes,
      1024,
      268435456,
      "4194304",
      "sluice-api: largest request body accepted (bytes; 413 past it)"),
    I("api_batch_max",
      "SLUICE_API_BATCH_MAX",
      api_batch_max,
      1,
      10000,
      "100",
      "sluice-api: events in one POST /v1/events/batch"),
    I("api_fanout_max",
      "SLUICE_API_FANOUT_MAX",
      api_fanout_max,
      1,
      1000000,
      "10000",
      "sluice-api: endpoints one event may fan out to (the publish is refused past it)"),
    I("api_publish_timeout_ms",
      "SLUICE_API_PUBLISH_TIMEOUT_MS",
      api_publish_timeout_ms,
      1000,
      300000,
      "10000",
      "sluice-api: how long a publish waits for Kafka's acknowledgement (ms; 503 past it)"),
    I("api_linger_ms",
      "SLUICE_API_LINGER_MS",
      api_linger_ms,
      1,
      900,
      "1",
      "sluice-api: how long a published record may wait in the producer for others to share "
      "its Kafka batch (linger.ms); every publish answers only once Kafka acknowledged it, so "
      "this adds to each request's time: more batches per second the shorter it is"),
    I("api_idempotency_ttl_s",
      "SLUICE_API_IDEMPOTENCY_TTL_S",
      api_idempotency_ttl_s,
      60,
      2592000,
      "86400",
      "sluice-api: how long the answer to an Idempotency-Key is kept (s)"),
    I("api_key_refresh_ms",
      "SLUICE_API_KEY_REFRESH_MS",
      api_key_refresh_ms,
      100,
      600000,
      "2000",
      "sluice-api: API keys are reloaded from PostgreSQL this often, so a revocation takes "
      "effect within it (ms)"),
    I("api_shutdown_ms",
      "SLUICE_API_SHUTDOWN_MS",
      api_shutdown_ms,
      0,
      600000,
      "10000",
      "sluice-api: on SIGTERM, time allowed for requests in flight to finish (ms)"),
    S("metrics_listen",
      "SLUICE_METRICS_LISTEN",
      metrics_listen,
      "",
      0,
      "address (host:port) of this process's /metrics, /healthz and /readyz (docs/METRICS.md); "
      "empty = off. No authentication: bind it where only monitoring reaches"),
    I("metrics_endpoint_top",
      "SLUICE_METRICS_ENDPOINT_TOP",
      metrics_endpoint_top,
      0,
      1000,
      "0",
      "sluice-consumer: N endpoints get per-endpoint series (sluice_endpoint_*, label "
      "endpoint): those with an open breaker first, then those with the most attempts; 0 = "
      "no endpoint label"),
    I("live_stall_ms",
      "SLUICE_LIVE_STALL_MS",
      live_stall_ms,
      1000,
      600000,
      "15000",
      "/healthz fails when a loop of the process has not turned for this long (ms)"),
    I("recorder_ready_lag",
      "SLUICE_RECORDER_READY_LAG",
      recorder_ready_lag,
      1,
      INT64_MAX,
      "1000000",
      "sluice-recorder: /readyz fails while its consumer lag is at least this many records"),
};

#define NOPTS (sizeof(opts) / sizeof(opts[0]))
_Static_assert(NOPTS <= sizeof(((struct sl_config *)0)->sources), "sources[] too small");

static char **str_field(struct sl_config *cfg, const struct opt *o)
{
    return (char **)(void *)((char *)cfg + o->off);
}

static int64_t *int_field(struct sl_config *cfg, const struct opt *o)
{
    return (int64_t *)(void *)((char *)cfg + o->off);
}

static bool *bool_field(struct sl_config *cfg, const struct opt *o)
{
    return (bool *)(void *)((char *)cfg + o->off);
}

static const char *src_name(int src, const char *file, char *buf, size_t len, int line)
{
    switch (src) {
    case SL_CFG_SRC_FILE:
        (void)snprintf(buf, len, "%s:%d", file ? file : "file", line);
        return buf;
    case SL_CFG_SRC_ENV:
        return "env";
    default:
        return "default";
    }
}

/* Printable form of a value in an error message: secrets are never echoed. */
static const char *shown(const struct opt *o, const char *val)
{
    return (o->flags & F_SECRET) ? "[redacted]" : val;
}

/* Parse val into the field; on failure print one error naming key, source and value. */
static int set_value(struct sl_config *cfg,
                     const struct opt *o,
                     const char *val,
                     int src,
                     const char *file,
                     int line,
                     FILE *errf)
{
    char sb[512];
    const char *key = src == SL_CFG_SRC_ENV ? o->env : o->name;
    switch (o->type) {
    case T_STR: {
        char **f = str_field(cfg, o);
        free(*f);
        *f = sl_xstrdup(val);
        break;
    }
    case T_INT: {
        char *end = NULL;
        errno = 0;
        long long v = strtoll(val, &end, 10);
        if (errno != 0 || end == val || *end != '\0' || v < o->min || v > o->max) {
            (void)fprintf(errf,
                          "invalid value for %s (%s): \"%s\": expected an integer in %lld..%lld\n",
                          key, src_name(src, file, sb, sizeof(sb), line), shown(o, val),
                          (long long)o->min, (long long)o->max);
            cfg->sources[o - opts] = SL_CFG_SRC_BAD;
            return -1;
        }
        *int_field(cfg, o) = v;
        break;
    }
    case T_BOOL:
        if (strcmp(val, "true") == 0) {
            *bool_field(cfg, o) = true;
        } else if (strcmp(val, "false") == 0) {
            *bool_field(cfg, o) = false;
        } else {
            (void)fprintf(errf, "invalid value for %s (%s): \"%s\": expected true or false\n", key,
                          src_name(src, file, sb, sizeof(sb), line), shown(o, val));
            cfg->sources[o - opts] = SL_CFG_SRC_BAD;
            return -1;
        }
        break;
    }
    cfg->sources[o - opts] = (unsigned char)src;
    return 0;
}

static const struct opt *find_name(const char *name)
{
    for (size_t i = 0; i < NOPTS; i++) {
        if (strcmp(opts[i].name, name) == 0)
            return &opts[i];
    }
    return NULL;
}

static const struct opt *find_env(const char *env)
{
    for (size_t i = 0; i < NOPTS; i++) {
        if (strcmp(opts[i].env, env) == 0)
            return &opts[i];
    }
    return NULL;
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' || s[n - 1] == '\r'))
        s[--n] = '\0';
    return s;
}

/* File format: `name = value` lines; '#' starts a comment line; values may be "quoted". */
static int load_file(struct sl_config *cfg, const char *path, FILE *errf)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        (void)fprintf(errf, "could not open config file %s: %s\n", path, strerror(errno));
        return 1;
    }
    int nerr = 0;
    char *linebuf = NULL;
    size_t cap = 0;
    ssize_t n;
    int lineno = 0;
    while ((n = getline(&linebuf, &cap, f)) >= 0) {
        lineno++;
        if (n > 8192) {
            (void)fprintf(errf, "%s:%d: line too long (%zd bytes, limit 8192)\n", path, lineno, n);
            nerr++;
            continue;
        }
        char *s = trim(linebuf);
        if (*s == '\0' || *s == '#')
            continue;
        char *eq = strchr(s, '=');
        if (!eq) {
            (void)fprintf(errf, "%s:%d: expected `name = value`\n", path, lineno);
            nerr++;
            continue;
        }
        *eq = '\0';
        char *key = trim(s);
        char *val = trim(eq + 1);
        size_t vl = strlen(val);
        if (vl >= 2 && val[0] == '"' && val[vl - 1] == '"') {
            val[vl - 1] = '\0';
            val++;
        }
        const struct opt *o = find_name(key);
        if (!o) {
            (void)fprintf(errf, "%s:%d: unknown option \"%s\"\n", path, lineno, key);
            nerr++;
            continue;
        }
        if (set_value(cfg, o, val, SL_CFG_SRC_FILE, path, lineno, errf) != 0)
            nerr++;
    }
    if (linebuf) {
        sl_secret_wipe(linebuf, cap);
        free(linebuf);
    }
    (void)fclose(f);
    return nerr;
}

/* SLUICE_* variables that belong to the scripts (stack, tests, demo), not to the processes. */
static bool script_var(const char *name)
{
    static const char *const prefixes[] = {"SLUICE_STACK_",
                                           "SLUICE_CACHE_",
                                           "SLUICE_PORT_BASE",
                                           "SLUICE_KAFKA_PORT",
                                           "SLUICE_KAFKA_CONTROLLER_PORT",
                                           "SLUICE_REDIS_PORT",
                                           "SLUICE_PG_PORT",
                                           "SLUICE_PARTITIONS",
                                           "SLUICE_KAFKA_HEAP",
                                           "SLUICE_KAFKA_READY_",
                                           "SLUICE_PG_BIN",
                                           "SLUICE_PG_OS_USER",
                                           "SLUICE_SQL_DIR",
                                           "SLUICE_STOP_",
                                           "SLUICE_TEST_",
                                           "SLUICE_DEMO_",
                                           "SLUICE_BENCH_",
                                           "SLUICE_BUILD_",
                                           "SLUICE_SKIP_"};
    for (size_t i = 0; i < sizeof(prefixes) / sizeof(prefixes[0]); i++) {
        if (strncmp(name, prefixes[i], strlen(prefixes[i])) == 0)
            return true;
    }
    return false;
}

static int load_env(struct sl_config *cfg, char *const *envp, FILE *errf)
{
    int nerr = 0;
    for (char *const *e = envp; e && *e; e++) {
        if (strncmp(*e, "SLUICE_", 7) != 0)
            continue;
        const char *eq = strchr(*e, '=');
        if (!eq)
            continue;
        char name[128];
        size_t nl = (size_t)(eq - *e);
        if (nl >= sizeof(name))
            nl = sizeof(name) - 1;
        memcpy(name, *e, nl);
        name[nl] = '\0';
        if (strcmp(name, "SLUICE_CONFIG_FILE") == 0)
            continue;
        const struct opt *o = find_env(name);
        if (!o) {
            if (script_var(name))
                continue;
            (void)fprintf(errf, "unknown environment variable %s (see --help-config)\n", name);
            nerr++;
            continue;
        }
        if (set_value(cfg, o, eq + 1, SL_CFG_SRC_ENV, NULL, 0, errf) != 0)
            nerr++;
    }
    return nerr;
}

/* host:port or [v6]:port; resolving waits for start-up (nothing connects here). name: the
 * key as the operator wrote it (opt_key). Returns the number of errors printed (0 or 1). */
static int check_listen(FILE *errf, const char *name, const char *l)
{
    const char *colon = strrchr(l, ':');
    char *end = NULL;
    long port = colon ? strtol(colon + 1, &end, 10) : -1;
    if (!colon || colon == l || !end || *end != '\0' || colon[1] == '\0' || port < 1 ||
        port > 65535) {
        (void)fprintf(errf,
                      "invalid value for %s: \"%s\": expected host:port (port 1..65535; IPv6 as "
                      "[addr]:port)\n",
                      name, l);
        return 1;
    }
    return 0;
}

/* ==== Kafka transport security (cross-field checks) ==== */

/* "SLUICE_X (env)", "x (file)" or "x (default)": the key as the operator wrote it. */
static const char *opt_key(const struct sl_config *cfg, const char *name, char *buf, size_t len)
{
    const struct opt *o = find_name(name);
    int src = cfg->sources[o - opts];
    if (src == SL_CFG_SRC_ENV)
        (void)snprintf(buf, len, "%s (env)", o->env);
    else
        (void)snprintf(buf, len, "%s (%s)", o->name,
                       src == SL_CFG_SRC_FILE ? "config file" : "default");
    return buf;
}

/* Replace *val by the entry of names[] it equals ignoring case; false if none does. */
static bool canonical(char *val, const char *const *names, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (strcasecmp(val, names[i]) == 0) {
            memcpy(val, names[i], strlen(names[i]));
            return true;
        }
    }
    return false;
}

/* A file option: a readable, non-empty regular file. Returns the number of errors (0 or 1). */
static int
check_readable(const struct sl_config *cfg, FILE *errf, const char *name, const char *path)
{
    char kb[96];
    struct stat st;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    const char *why = NULL;
    int e = errno;
    if (fd < 0) {
        why = strerror(e);
    } else if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        why = "not a regular file";
    } else {
        char c;
        ssize_t n = read(fd, &c, 1);
        why = n < 0 ? strerror(errno) : n == 0 ? "the file is empty" : NULL;
    }
    if (fd >= 0)
        close(fd);
    if (!why)
        return 0;
    (void)fprintf(errf, "invalid value for %s: \"%s\": cannot read it: %s\n",
                  opt_key(cfg, name, kb, sizeof(kb)), path, why);
    return 1;
}

/* OpenSSL's passphrase callback: the configured key password, or none (then an encrypted key
 * fails to load and *asked tells why). */
struct key_pw {
    const char *pw; /* kafka_ssl_key_password, "" = none */
    bool asked;     /* OUT: the key is encrypted */
};

static int key_pw_cb(char *buf, int size, int rwflag, void *u)
{
    (void)rwflag;
    struct key_pw *kp = u;
    kp->asked = true;
    size_t n = strlen(kp->pw);
    if (n == 0 || n >= (size_t)size)
        return -1;
    memcpy(buf, kp->pw, n);
    return (int)n;
}

/* A CA file option holds at least one PEM certificate. Returns the number of errors (0 or 1). */
static int check_pem_ca(const struct sl_config *cfg, FILE *errf, const char *name, const char *path)
{
    char kb[96];
    BIO *b = BIO_new_file(path, "r");
    X509 *x = b ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL;
    int nerr = 0;
    if (!x) {
        (void)fprintf(errf, "invalid value for %s: \"%s\": no PEM certificate in it\n",
                      opt_key(cfg, name, kb, sizeof(kb)), path);
        nerr++;
    }
    X509_free(x);
    BIO_free(b);
    ERR_clear_error();
    return nerr;
}

/* A CA file option for libcurl (endpoint_ca_file, delivery_proxy_ca_file): readable, and at
 * least one PEM certificate in it. Returns the number of errors (0 or 1). */
static int
check_curl_ca(const struct sl_config *cfg, FILE *errf, const char *name, const char *path)
{
    int e = check_readable(cfg, errf, name, path);
    return e ? e : check_pem_ca(cfg, errf, name, path);
}

/* The certificate, key and CA files load as librdkafka will load them (PEM), the key with
 * its password, and the certificate belongs to the key. Only called for files that are
 * readable. Returns the number of errors. */
static int check_pem(const struct sl_config *cfg, FILE *errf)
{
    char kb[96], kb2[96];
    int nerr = 0;
    if (cfg->kafka_ssl_ca_file[0])
        nerr += check_pem_ca(cfg, errf, "kafka_ssl_ca_file", cfg->kafka_ssl_ca_file);
    X509 *cert = NULL;
    EVP_PKEY *key = NULL;
    if (cfg->kafka_ssl_cert_file[0]) {
        BIO *b = BIO_new_file(cfg->kafka_ssl_cert_file, "r");
        cert = b ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL;
        BIO_free(b);
        if (!cert) {
            (void)fprintf(errf, "invalid value for %s: \"%s\": no PEM certificate in it\n",
                          opt_key(cfg, "kafka_ssl_cert_file", kb, sizeof(kb)),
                          cfg->kafka_ssl_cert_file);
            nerr++;
        }
    }
    if (cfg->kafka_ssl_key_file[0]) {
        struct key_pw kp = {cfg->kafka_ssl_key_password, false};
        BIO *b = BIO_new_file(cfg->kafka_ssl_key_file, "r");
        key = b ? PEM_read_bio_PrivateKey(b, NULL, key_pw_cb, &kp) : NULL;
        BIO_free(b);
        if (!key && kp.asked && !cfg->kafka_ssl_key_password[0]) {
            (void)fprintf(errf,
                          "invalid value for %s: \"%s\": the key is encrypted and "
                          "kafka_ssl_key_password (SLUICE_KAFKA_SSL_KEY_PASSWORD) is empty\n",
                          opt_key(cfg, "kafka_ssl_key_file", kb, sizeof(kb)),
                          cfg->kafka_ssl_key_file);
            nerr++;
        } else if (!key && kp.asked) {
            (void)fprintf(errf, "%s does not decrypt %s: \"%s\"\n",
                          opt_key(cfg, "kafka_ssl_key_password", kb, sizeof(kb)),
                          opt_key(cfg, "kafka_ssl_key_file", kb2, sizeof(kb2)),
                          cfg->kafka_ssl_key_file);
            nerr++;
        } else if (!key) {
            (void)fprintf(errf, "invalid value for %s: \"%s\": no PEM private key in it\n",
                          opt_key(cfg, "kafka_ssl_key_file", kb, sizeof(kb)),
                          cfg->kafka_ssl_key_file);
            nerr++;
        }
    }
    if (cert && key && X509_check_private_key(cert, key) != 1) {
        (void)fprintf(errf,
                      "%s and %s do not belong together: the certificate is not for this key\n",
                      opt_key(cfg, "kafka_ssl_cert_file", kb, sizeof(kb)),
                      opt_key(cfg, "kafka_ssl_key_file", kb2, sizeof(kb2)));
        nerr++;
    }
    X509_free(cert);
    EVP_PKEY_free(key);
    ERR_clear_error(); /* nothing of this may surface in a later TLS error */
    return nerr;
}

/*
 * security.protocol and its companions, as sl_kafka_conf_new applies them: a known protocol
 * and mechanism (canonical spelling written back), SASL credentials exactly when SASL is on,
 * TLS files only with TLS and then readable, loadable and matching. Returns the number of
 * errors printed.
 */
static int check_kafka_security(struct sl_config *cfg, FILE *errf)
{
    static const char *const protocols[] = {"PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"};
    static const char *const mechanisms[] = {"SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"};
    char kb[96];
    int nerr = 0;
    if (!canonical(cfg->kafka_security_protocol, protocols, 4)) {
        (void)fprintf(errf,
                      "invalid value for %s: \"%s\": expected PLAINTEXT, SSL, SASL_SSL or "
                      "SASL_PLAINTEXT\n",
                      opt_key(cfg, "kafka_security_protocol", kb, sizeof(kb)),
                      cfg->kafka_security_protocol);
        return 1; /* the combinations below mean nothing without it */
    }
    if (!canonical(cfg->kafka_sasl_mechanism, mechanisms, 3)) {
        (void)fprintf(
            errf, "invalid value for %s: \"%s\": expected SCRAM-SHA-512, SCRAM-SHA-256 or PLAIN\n",
            opt_key(cfg, "kafka_sasl_mechanism", kb, sizeof(kb)), cfg->kafka_sasl_mechanism);
        nerr++;
    }
    const char *proto = cfg->kafka_security_protocol;
    bool sasl = strncmp(proto, "SASL_", 5) == 0;
    bool tls = strcmp(proto, "SSL") == 0 || strcmp(proto, "SASL_SSL") == 0;
    const struct {
        const char *name;
        const char *val;
    } sasl_opts[] = {{"kafka_sasl_username", cfg->kafka_sasl_username},
                     {"kafka_sasl_password", cfg->kafka_sasl_password}},
      tls_opts[] = {{"kafka_ssl_ca_file", cfg->kafka_ssl_ca_file},
                    {"kafka_ssl_cert_file", cfg->kafka_ssl_cert_file},
                    {"kafka_ssl_key_file", cfg->kafka_ssl_key_file},
                    {"kafka_ssl_key_password", cfg->kafka_ssl_key_password}};
    for (size_t i = 0; i < 2; i++) {
        const struct opt *o = find_name(sasl_opts[i].name);
        if (sasl && !sasl_opts[i].val[0]) {
            (void)fprintf(errf, "kafka_security_protocol is %s but %s (%s) is empty\n", proto,
                          o->name, o->env);
            nerr++;
        } else if (!sasl && sasl_opts[i].val[0]) {
            (void)fprintf(errf,
                          "%s is set but kafka_security_protocol is %s: SASL credentials need "
                          "SASL_SSL or SASL_PLAINTEXT\n",
                          opt_key(cfg, o->name, kb, sizeof(kb)), proto);
            nerr++;
        }
    }
    int file_errs = 0;
    for (size_t i = 0; i < 4; i++) {
        if (!tls_opts[i].val[0])
            continue;
        if (!tls) {
            (void)fprintf(errf,
                          "%s is set but kafka_security_protocol is %s: TLS settings need SSL or "
                          "SASL_SSL\n",
                          opt_key(cfg, tls_opts[i].name, kb, sizeof(kb)), proto);
            nerr++;
        } else if (i < 3) {
            file_errs += check_readable(cfg, errf, tls_opts[i].name, tls_opts[i].val);
        }
    }
    if (!tls)
        return nerr;
    if (cfg->kafka_ssl_cert_file[0] && !cfg->kafka_ssl_key_file[0]) {
        (void)fprintf(errf,
                      "%s is set but kafka_ssl_key_file (SLUICE_KAFKA_SSL_KEY_FILE) is empty\n",
                      opt_key(cfg, "kafka_ssl_cert_file", kb, sizeof(kb)));
        nerr++;
    } else if (cfg->kafka_ssl_key_file[0] && !cfg->kafka_ssl_cert_file[0]) {
        (void)fprintf(errf,
                      "%s is set but kafka_ssl_cert_file (SLUICE_KAFKA_SSL_CERT_FILE) is empty\n",
                      opt_key(cfg, "kafka_ssl_key_file", kb, sizeof(kb)));
        nerr++;
    } else if (cfg->kafka_ssl_key_password[0] && !cfg->kafka_ssl_key_file[0]) {
        (void)fprintf(errf,
                      "%s is set but kafka_ssl_key_file (SLUICE_KAFKA_SSL_KEY_FILE) is empty\n",
                      opt_key(cfg, "kafka_ssl_key_password", kb, sizeof(kb)));
        nerr++;
    }
    nerr += file_errs;
    if (file_errs == 0)
        nerr += check_pem(cfg, errf);
    return nerr;
}

/* ==== Endpoint addresses ==== */

/* ssrf_allow_cidrs must parse in every process: the consumers apply it to each connection,
 * sluice-api and sluicectl to the URLs they register (sl_ssrf.h). delivery_proxy must be a
 * proxy URL curl tunnels through. Returns the number of errors printed. */
static int check_endpoint_reach(const struct sl_config *cfg, FILE *errf)
{
    int nerr = 0;
    struct sl_ssrf_policy p;
    sl_err_t err;
    char kb[96];
    if (sl_ssrf_parse(&p, cfg->ssrf_protection, cfg->ssrf_allow_cidrs, &err) != 0) {
        (void)fprintf(errf, "invalid value for %s: %s\n",
                      opt_key(cfg, "ssrf_allow_cidrs", kb, sizeof(kb)), err.msg);
        nerr++;
    }
    if (cfg->delivery_proxy[0] && sl_url_proxy_check(cfg->delivery_proxy, &err) != 0) {
        /* the message never echoes the URL: it may hold a password */
        (void)fprintf(errf, "invalid value for %s: %s\n",
                      opt_key(cfg, "delivery_proxy", kb, sizeof(kb)), err.msg);
        nerr++;
    }
    if (cfg->delivery_proxy_ca_file[0]) {
        if (strncasecmp(cfg->delivery_proxy, "https://", 8) != 0) {
            char kb2[96];
            (void)fprintf(errf,
                          "%s is set, but %s is not an https:// proxy: nothing would use it\n",
                          opt_key(cfg, "delivery_proxy_ca_file", kb, sizeof(kb)),
                          opt_key(cfg, "delivery_proxy", kb2, sizeof(kb2)));
            nerr++;
        } else {
            nerr += check_curl_ca(cfg, errf, "delivery_proxy_ca_file", cfg->delivery_proxy_ca_file);
        }
    }
    return nerr;
}

/* Whether options a and b hold values that were not refused: a check across them then
 * judges what the operator wrote, not the default a refused value left in place. */
static bool both_taken(const struct sl_config *cfg, const char *a, const char *b)
{
    return sl_cfg_source(cfg, a) != SL_CFG_SRC_BAD && sl_cfg_source(cfg, b) != SL_CFG_SRC_BAD;
}

/* The checks across options and of values' contents. Run also when some value was refused
 * (every problem is listed at once); checks across a refused value are left out. */
static int finalize(struct sl_config *cfg, FILE *errf)
{
    int nerr = 0;
    enum sl_log_level lv;
    unsigned mask;
    if (sl_log_level_parse(cfg->log_level, &lv) != 0) {
        (void)fprintf(errf,
                      "invalid value for log_level: \"%s\": expected error, warn, info or debug\n",
                      cfg->log_level);
        nerr++;
    }
    if (sl_log_debug_parse(cfg->debug, &mask) != 0) {
        (void)fprintf(errf,
                      "invalid value for debug: \"%s\": expected a list of kafka, http, redis, db, "
                      "cfg, all\n",
                      cfg->debug);
        nerr++;
    }
    if (cfg->instance_id[0]) {
        /* it names the pod in every outcome record, whose contract refuses anything else */
        size_t n = strlen(cfg->instance_id);
        bool bad = n > SL_POD_MAX;
        for (size_t i = 0; i < n && !bad; i++)
            bad = (unsigned char)cfg->instance_id[i] < 0x21 ||
                  (unsigned char)cfg->instance_id[i] > 0x7e;
        if (bad) {
            (void)fprintf(
                errf,
                "invalid value for instance_id: expected 1..%d visible ASCII characters (no "
                "spaces or control characters)\n",
                SL_POD_MAX);
            nerr++;
        }
    }
    if (both_taken(cfg, "http_connect_timeout_ms", "http_timeout_ms") &&
        cfg->http_connect_timeout_ms > cfg->http_timeout_ms) {
        (void)fprintf(errf,
                      "http_connect_timeout_ms (%lld) must not exceed http_timeout_ms (%lld)\n",
                      (long long)cfg->http_connect_timeout_ms, (long long)cfg->http_timeout_ms);
        nerr++;
    }
    char kb[96];
    nerr += check_listen(errf, opt_key(cfg, "api_listen", kb, sizeof(kb)), cfg->api_listen);
    if (cfg->metrics_listen[0])
        nerr +=
            check_listen(errf, opt_key(cfg, "metrics_listen", kb, sizeof(kb)), cfg->metrics_listen);
    if (both_taken(cfg, "shutdown_drain_ms", "shutdown_timeout_ms") &&
        cfg->shutdown_drain_ms > cfg->shutdown_timeout_ms - 5000) {
        (void)fprintf(errf,
                      "shutdown_drain_ms (%lld) must leave at least 5000 ms of shutdown_timeout_ms "
                      "(%lld) for flushing, committing and leaving the group\n",
                      (long long)cfg->shutdown_drain_ms, (long long)cfg->shutdown_timeout_ms);
        nerr++;
    }
    if (both_taken(cfg, "lease_ms", "http_timeout_ms") && cfg->lease_ms <= cfg->http_timeout_ms) {
        (void)fprintf(
            errf,
            "lease_ms (%lld) must exceed http_timeout_ms (%lld) so a slow request's retry "
            "job is never claimed twice\n",
            (long long)cfg->lease_ms, (long long)cfg->http_timeout_ms);
        nerr++;
    }
    if (both_taken(cfg, "retry_base_ms", "retry_cap_ms") &&
        cfg->retry_base_ms > cfg->retry_cap_ms) {
        (void)fprintf(errf, "retry_base_ms (%lld) must not exceed retry_cap_ms (%lld)\n",
                      (long long)cfg->retry_base_ms, (long long)cfg->retry_cap_ms);
        nerr++;
    }
    if (both_taken(cfg, "breaker_cooldown_ms", "breaker_cooldown_max_ms") &&
        cfg->breaker_cooldown_ms > cfg->breaker_cooldown_max_ms) {
        (void)fprintf(errf,
                      "breaker_cooldown_ms (%lld) must not exceed breaker_cooldown_max_ms (%lld)\n",
                      (long long)cfg->breaker_cooldown_ms, (long long)cfg->breaker_cooldown_max_ms);
        nerr++;
    }
    if (cfg->endpoint_ca_file[0])
        nerr += check_curl_ca(cfg, errf, "endpoint_ca_file", cfg->endpoint_ca_file);
    nerr += check_endpoint_reach(cfg, errf);
    if (both_taken(cfg, "response_keep_bytes", "response_max_bytes") &&
        cfg->response_keep_bytes > cfg->response_max_bytes) {
        (void)fprintf(errf,
                      "response_keep_bytes (%lld) must not exceed response_max_bytes (%lld)\n",
                      (long long)cfg->response_keep_bytes, (long long)cfg->response_max_bytes);
        nerr++;
    }
    const char *topics[] = {cfg->topic_deliveries, cfg->topic_outcomes, cfg->topic_quarantine,
                            cfg->topic_endpoints,  cfg->kafka_brokers,  cfg->consumer_group,
                            cfg->recorder_group};
    const char *tnames[] = {"topic_deliveries", "topic_outcomes", "topic_quarantine",
                            "topic_endpoints",  "kafka_brokers",  "consumer_group",
                            "recorder_group"};
    for (size_t i = 0; i < sizeof(topics) / sizeof(topics[0]); i++) {
        if (topics[i][0] == '\0') {
            (void)fprintf(errf, "%s must not be empty\n", tnames[i]);
            nerr++;
        }
    }
    struct sl_redis_url ru;
    sl_err_t rerr;
    if (sl_redis_url_parse(cfg->redis_url, &ru, &rerr) != 0) {
        /* the message never echoes the URL: it may hold a password */
        (void)fprintf(errf, "invalid value for %s: %s\n", opt_key(cfg, "redis_url", kb, sizeof(kb)),
                      rerr.msg);
        nerr++;
    }
    sl_redis_url_fini(&ru);
    nerr += check_kafka_security(cfg, errf);
    return nerr;
}

int sl_cfg_load(struct sl_config *cfg, const char *file, char *const *envp, FILE *errf)
{
    memset(cfg, 0, sizeof(*cfg));
    if (!errf)
        errf = stderr;
    if (!envp)
        envp = environ;
    int nerr = 0;
    for (size_t i = 0; i < NOPTS; i++) {
        if (set_value(cfg, &opts[i], opts[i].def, SL_CFG_SRC_DEFAULT, NULL, 0, errf) != 0)
            nerr++; /* a bad default is a bug, but report it like any other */
    }
    if (!file) {
        for (char *const *e = envp; *e; e++) {
            if (strncmp(*e, "SLUICE_CONFIG_FILE=", 19) == 0 && (*e)[19])
                file = *e + 19;
        }
    }
    if (file)
        nerr += load_file(cfg, file, errf);
    nerr += load_env(cfg, envp, errf);
    nerr += finalize(cfg, errf);
    return nerr;
}

void sl_cfg_fini(struct sl_config *cfg)
{
    for (size_t i = 0; i < NOPTS; i++) {
        if (opts[i].type == T_STR) {
            char **f = str_field(cfg, &opts[i]);
            if (*f && (opts[i].flags & F_SECRET))
                sl_secret_wipe(*f, strlen(*f));
            free(*f);
            *f = NULL;
        }
    }
}

static const char *type_name(const struct opt *o)
{
    return o->type == T_STR ? "string" : o->type == T_INT ? "integer" : "boolean";
}

void sl_cfg_print_help(FILE *f)
{
    (void)fprintf(f, "Configuration (default < config file < environment):\n\n");
    for (size_t i = 0; i < NOPTS; i++) {
        const struct opt *o = &opts[i];
        (void)fprintf(f, "  %-28s %-34s %s", o->name, o->env, type_name(o));
        if (o->type == T_INT)
            (void)fprintf(f, " %lld..%lld", (long long)o->min, (long long)o->max);
        (void)fprintf(f, "\n      %s (default: \"%s\")%s\n", o->help, o->def,
                      (o->flags & F_SECRET) ? " [secret]" : "");
    }
}

/*
 * A libpq conninfo (key=value or postgresql:// URI) as libpq reads it: when it sets a
 * password, the options it sets as key=value pairs with the password shown as [redacted];
 * otherwise out keeps val. One it cannot parse is not shown at all (it may hold a password in
 * a form we cannot find).
 */
/* Append " keyword=value" to out (at *n, NUL-terminated, cut at outlen): the value quoted
 * and escaped as libpq reads it when it needs quotes, "[redacted]" for a password. */
static void
append_conninfo_kv(char *out, size_t outlen, size_t *n, const char *keyword, const char *val)
{
    bool pw = strcmp(keyword, "password") == 0;
    bool quote = !pw && (!val[0] || strpbrk(val, " '\\") != NULL);
    int w = snprintf(out + *n, outlen - *n, "%s%s=%s", *n ? " " : "", keyword, quote ? "'" : "");
    *n += w > 0 ? (size_t)w : 0;
    for (const char *v = pw ? "[redacted]" : val; *v && *n + 2 < outlen; v++) {
        if (quote && (*v == '\'' || *v == '\\'))
            out[(*n)++] = '\\';
        out[(*n)++] = *v;
    }
    if (quote && *n + 1 < outlen)
        out[(*n)++] = '\'';
    if (*n < outlen)
        out[*n] = '\0';
}

static void mask_conninfo(const char *val, char *out, size_t outlen)
{
    char *errmsg = NULL;
    PQconninfoOption *ci = PQconninfoParse(val, &errmsg);
    PQfreemem(errmsg);
    if (!ci) {
        (void)snprintf(out, outlen, "[not shown: libpq cannot parse it]");
        return;
    }
    bool has_pw = false;
    for (PQconninfoOption *c = ci; c->keyword; c++)
        has_pw |= strcmp(c->keyword, "password") == 0 && c->val && c->val[0];
    if (has_pw) {
        size_t n = 0;
        out[0] = '\0';
        for (PQconninfoOption *c = ci; c->keyword && n < outlen; c++) {
            if (c->val)
                append_conninfo_kv(out, outlen, &n, c->keyword, c->val);
        }
    }
    PQconninfoFree(ci);
}

/* Mask a secret option entirely, the password of a libpq conninfo, and :password@ in a URL. */
static void mask_value(const struct opt *o, const char *val, char *out, size_t outlen)
{
    if (o->flags & F_SECRET) {
        (void)snprintf(out, outlen, "%s", val[0] ? "[redacted]" : "");
        return;
    }
    (void)snprintf(out, outlen, "%s", val);
    if ((o->flags & F_DSN) && val[0])
        mask_conninfo(val, out, outlen);
    if (o->flags & F_URL) {
        char *scheme = strstr(out, "://");
        char *at = scheme ? strrchr(scheme + 3, '@') : NULL; /* a password may hold '@' */
        if (scheme && at) {
            char tail[512];
            (void)snprintf(tail, sizeof(tail), "%s", at);
            (void)snprintf(scheme + 3, outlen - (size_t)(scheme + 3 - out), "[redacted]%s", tail);
        }
    }
}

void sl_cfg_print(const struct sl_config *cfg, FILE *f)
{
    static const char *const srcn[] = {"default", "file", "env"};
    for (size_t i = 0; i < NOPTS; i++) {
        const struct opt *o = &opts[i];
        char val[1024];
        const void *base = cfg;
        if (o->type == T_STR) {
            const char *s = *(char *const *)(const void *)((const char *)base + o->off);
            mask_value(o, s ? s : "", val, sizeof(val));
        } else if (o->type == T_INT) {
            (void)snprintf(
                val, sizeof(val), "%lld",
                (long long)*(const int64_t *)(const void *)((const char *)base + o->off));
        } else {
            (void)snprintf(val, sizeof(val), "%s",
                           *(const bool *)(const void *)((const char *)base + o->off) ? "true"
                                                                                      : "false");
        }
        (void)fprintf(f, "%s = \"%s\"  # %s\n", o->name, val, srcn[cfg->sources[i]]);
    }
}

void sl_cfg_print_markdown(FILE *f)
{
    (void)fprintf(
        f, "# Configuration reference\n\n"
           "Generated from the option table in common/sl_cfg.c by `sluicectl config-doc`; do "
           "not edit by hand.\n\n"
           "Precedence: default < config file (`--config FILE` or `SLUICE_CONFIG_FILE`, "
           "lines of `name = value`) < environment. Bad values fail start-up with exit code "
           "78 and a message naming the key, its source and the value (secrets are never "
           "echoed); every problem is listed at once, the rules across two keys included "
           "(one whose value was refused is left out of them), and `--check-config` "
           "checks the same without starting.\n\n"
           "| name | environment | type | range | default | description |\n"
           "|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < NOPTS; i++) {
        const struct opt *o = &opts[i];
        char range[64] = "";
        if (o->type == T_INT)
            (void)snprintf(range, sizeof(range), "%lld..%lld", (long long)o->min,
                           (long long)o->max);
        (void)fprintf(f, "| `%s` | `%s` | %s | %s | `%s` | %s%s |\n", o->name, o->env, type_name(o),
                      range, o->def, o->help, (o->flags & F_SECRET) ? " **secret**" : "");
    }
}

int sl_cfg_source(const struct sl_config *cfg, const char *name)
{
    const struct opt *o = find_name(name);
    return o ? cfg->sources[o - opts] : -1;
}

/* pw's percent escapes decoded (%00 kept), registered with the logger when there were any. */
static void register_decoded(const char *pw)
{
    if (!strchr(pw, '%'))
        return;
    size_t n = strlen(pw), o = 0;
    char *dec = sl_xmalloc(n + 1);
    for (size_t i = 0; i < n; i++) {
        int hi = i + 2 < n && pw[i] == '%' ? sl_hex_digit(pw[i + 1]) : -1;
        int lo = hi >= 0 ? sl_hex_digit(pw[i + 2]) : -1;
        if (hi >= 0 && lo >= 0 && (hi | lo) != 0) {
            dec[o++] = (char)(hi * 16 + lo);
            i += 2;
        } else {
            dec[o++] = pw[i];
        }
    }
    dec[o] = '\0';
    sl_log_add_secret(dec);
    sl_secret_wipe(dec, o);
    free(dec);
}

/* The password of scheme://user:password@host as written and, when it holds percent
 * escapes, as decoded (what the client sends, and what a library's text could quote). */
static void register_url_password(const char *url)
{
    const char *s = strstr(url, "://");
    const char *at = s ? strrchr(s + 3, '@') : NULL;
    if (s && at) {
        const char *colon = memchr(s + 3, ':', (size_t)(at - (s + 3)));
        if (colon && colon + 1 < at) {
            char *pw = sl_xstrndup(colon + 1, (size_t)(at - colon - 1));
            sl_log_add_secret(pw);
            register_decoded(pw);
            sl_secret_wipe(pw, strlen(pw));
            free(pw);
        }
    }
}

static void register_secrets(const struct sl_config *cfg)
{
    /* every secret option: master_key, kafka_sasl_password, kafka_ssl_key_password */
    for (size_t i = 0; i < NOPTS; i++) {
        if (opts[i].type == T_STR && (opts[i].flags & F_SECRET))
            sl_log_add_secret(*(char *const *)(const void *)((const char *)cfg + opts[i].off));
    }
    /* the passwords in URLs: redis (as written and as sent), the delivery proxy */
    register_url_password(cfg->redis_url);
    register_url_password(cfg->delivery_proxy);
    struct sl_redis_url ru;
    if (sl_redis_url_parse(cfg->redis_url, &ru, NULL) == 0 && ru.password)
        sl_log_add_secret(ru.password);
    sl_redis_url_fini(&ru);
    /* the PostgreSQL password as libpq reads it (key=value, quoted or not, or a URI) */
    char *errmsg = NULL;
    PQconninfoOption *pq = cfg->pg_dsn[0] ? PQconninfoParse(cfg->pg_dsn, &errmsg) : NULL;
    PQfreemem(errmsg);
    for (PQconninfoOption *c = pq; c && c->keyword; c++) {
        if (strcmp(c->keyword, "password") == 0 && c->val && c->val[0]) {
            sl_log_add_secret(c->val);
            sl_secret_wipe(c->val, strlen(c->val));
        }
    }
    PQconninfoFree(pq);
}

/* master_key of a process that cannot start without it (its start and --check-config),
 * counted with the other configuration errors. Returns the number of problems printed (0 or
 * 1). */
static int check_master_key(const struct sl_config *cfg, const char *proc)
{
    if (!cfg->master_key[0]) {
        (void)fprintf(stderr,
                      "%s: master_key (SLUICE_MASTER_KEY) is required (it seals and opens the "
                      "endpoints' signing secrets)\n",
                      proc);
        return 1;
    }
    struct sl_masterkey mk;
    sl_err_t err;
    int rc = sl_masterkey_parse(&mk, cfg->master_key, &err);
    sl_masterkey_fini(&mk);
    if (rc != 0) {
        (void)fprintf(stderr, "%s: invalid value for master_key: %s\n", proc, err.msg);
        return 1;
    }
    return 0;
}

/* Load the configuration for proc: its flags out of argv (the rest stays), the load, and
 * --help-config, --print-config, --check-config. A daemon (usage given) takes no other
 * argument: one left is a usage error (exit 2) before the configuration is judged. */
static void main_load(struct sl_config *cfg,
                      const char *proc,
                      int *argc,
                      char **argv,
                      bool needs_master_key,
                      void (*usage)(FILE *f))
{
    const char *file = NULL;
    bool help = false, print = false, check = false;
    int out = 1;
    for (int i = 1; i < *argc; i++) {
        if (strcmp(argv[i], "--config") == 0 && i + 1 < *argc) {
            file = argv[++i];
        } else if (strcmp(argv[i], "--config") == 0) {
            (void)fprintf(stderr, "%s: --config needs a FILE (--config FILE or --config=FILE)\n",
                          proc);
            exit(2);
        } else if (strncmp(argv[i], "--config=", 9) == 0) {
            file = argv[i] + 9;
        } else if (strcmp(argv[i], "--help-config") == 0) {
            help = true;
        } else if (strcmp(argv[i], "--print-config") == 0) {
            print = true;
        } else if (strcmp(argv[i], "--check-config") == 0) {
            check = true;
        } else {
            argv[out++] = argv[i];
        }
    }
    argv[out] = NULL;
    *argc = out;
    if (usage && *argc > 1) {
        (void)fprintf(stderr, "%s: unknown argument \"%s\"\n", proc, argv[1]);
        usage(stderr);
        exit(2);
    }
    if (help) {
        sl_cfg_print_help(stdout);
        exit(0);
    }
    int nerr = sl_cfg_load(cfg, file, NULL, stderr);
    if (needs_master_key)
        nerr += check_master_key(cfg, proc);
    if (nerr > 0) {
        (void)fprintf(stderr, "%s: %d configuration error%s%s\n", proc, nerr, nerr == 1 ? "" : "s",
                      check ? "" : ", not starting");
        exit(SL_CFG_EXIT);
    }
    enum sl_log_level lv = SL_LOG_INFO;
    unsigned mask = 0;
    (void)sl_log_level_parse(cfg->log_level, &lv);
    (void)sl_log_debug_parse(cfg->debug, &mask);
    sl_log_init(proc, lv, mask);
    register_secrets(cfg);
    if (print) {
        sl_cfg_print(cfg, stdout);
        exit(0);
    }
    if (check) {
        printf("%s: configuration ok\n", proc);
        exit(0);
    }
}

void sl_cfg_main_load(struct sl_config *cfg, const char *proc, int *argc, char **argv)
{
    main_load(cfg, proc, argc, argv, false, NULL);
}

int sl_cfg_main_daemon(struct sl_config *cfg,
                       const char *proc,
                       void (*usage)(FILE *f),
                       void (*on_stop)(int sig),
                       int *argc,
                       char **argv)
{
    for (int i = 1; i < *argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            exit(0);
        }
        if (strcmp(argv[i], "--version") == 0) {
            printf("%s %s\n", proc, SL_VERSION);
            exit(0);
        }
    }
    main_load(cfg, proc, argc, argv, true, usage);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    (void)signal(SIGPIPE, SIG_IGN);
    return -1;
}
