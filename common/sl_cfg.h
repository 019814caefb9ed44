/*
 * sl_cfg: one descriptor table drives configuration for every Sluice process.
 *
 * Each option has a name (used in config files: `http_timeout_ms = 15000`), an environment
 * variable (SLUICE_HTTP_TIMEOUT_MS), a type, bounds, a default, flags (secret) and help.
 * The same table loads, validates, prints --help-config and --print-config (redacted), and
 * generates docs/CONFIG.md (sluicectl config-doc).
 *
 * Precedence: default < file (--config FILE or SLUICE_CONFIG_FILE) < environment. Every value
 * remembers its source so errors can cite it: `invalid value for SLUICE_HTTP_TIMEOUT_MS (env):
 * "15s": expected an integer in 100..600000`. Parsing is strict (strtoll with end pointer and
 * range checks, booleans only true/false). All errors are collected and reported together;
 * sl_cfg_main_load() then exits with SL_CFG_EXIT (78, EX_CONFIG) before anything connects.
 *
 * thread: load at start-up on the main thread; the loaded struct is read-only afterwards.
 */
#ifndef SL_CFG_H
#define SL_CFG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define SL_CFG_EXIT 78 /* EX_CONFIG from sysexits.h */

/* Upper bound of recorder_lanes (the recorder's REC_MAX_LANES is defined from it). */
#define SL_CFG_RECORDER_LANES_MAX 16

/* The effective configuration. Strings are owned by the struct (sl_cfg_fini frees). */
struct sl_config {
    /* kafka */
    char *kafka_brokers;              /* bootstrap list host:port[,host:port] */
    char *topic_deliveries;           /* delivery records (key = endpoint id) */
    char *topic_outcomes;             /* one record per attempt / state change */
    char *topic_quarantine;           /* undecodable / invalid records with a reason */
    char *topic_endpoints;            /* compacted endpoint registry */
    char *consumer_group;             /* sluice-consumer group id */
    char *recorder_group;             /* sluice-recorder group id */
    int64_t kafka_session_timeout_ms; /* group session timeout, ms */
    int64_t kafka_fetch_wait_ms;      /* fetch.wait.max.ms of every consumer, ms */
    int64_t kafka_fetch_min_bytes;    /* fetch.min.bytes of every consumer */
    int64_t consumer_prefetch_kb;     /* consumer: queued.max.messages.kbytes per loop */
    /* kafka transport security (every client of every process, see sl_kafka_conf_new) */
    char *kafka_security_protocol; /* PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL */
    char *kafka_sasl_mechanism;    /* SCRAM-SHA-512, SCRAM-SHA-256 or PLAIN (SASL_* only) */
    char *kafka_sasl_username;     /* SASL user name; "" = none */
    char *kafka_sasl_password;     /* SASL password; secret */
    char *kafka_ssl_ca_file;       /* PEM CA certificates for the brokers; "" = system store */
    char *kafka_ssl_cert_file;     /* PEM client certificate (mutual TLS); "" = none */
    char *kafka_ssl_key_file;      /* PEM private key of kafka_ssl_cert_file */
    char *kafka_ssl_key_password;  /* passphrase of an encrypted key file; secret */
    /* redis */
    char *redis_url;          /* redis://[[user]:password@]host:port[/db]; password secret */
    int64_t redis_timeout_ms; /* connect and command timeout, ms */
    /* postgresql */
    char *pg_dsn; /* libpq conninfo; password masked in output */
    /* secrets */
    char *master_key; /* master keys "[id:]key,..." (sl_secretbox.h); secret */
    /* logging */
    char *log_level;   /* error|warn|info|debug */
    char *debug;       /* debug contexts: kafka,http,redis,db,cfg,all */
    char *instance_id; /* this process's id in outcomes and leases ("" = host-pid) */
    /* delivery */
    int64_t http_timeout_ms;           /* total request timeout, ms */
    int64_t http_connect_timeout_ms;   /* connect (TCP+TLS) timeout, ms */
    int64_t consumer_threads;          /* delivery loops per consumer process */
    int64_t max_inflight;              /* global cap on concurrent requests */
    bool adaptive_inflight;            /* a saturated loop lowers its in-flight cap */
    int64_t max_inflight_per_endpoint; /* per-endpoint cap on concurrent requests */
    int64_t max_queued;                /* jobs held beyond max_inflight before intake stops */
    int64_t endpoint_backlog;          /* in-memory queued deliveries per endpoint before spill */
    int64_t max_body_bytes;            /* largest body accepted from producers */
    int64_t response_keep_bytes;       /* response body prefix kept in outcomes */
    int64_t response_max_bytes;        /* response read past this aborts the transfer */
    char *ssrf_allow_cidrs;            /* comma-separated CIDRs exempt from SSRF refusal */
    char *endpoint_ca_file; /* PEM CA certificates for HTTPS endpoints; "" = libcurl's default */
    char *delivery_proxy;   /* proxy every delivery is tunnelled through; "" = direct */
    char *delivery_proxy_ca_file; /* PEM CAs for an https:// proxy's certificate; "" = system's */
    bool ssrf_protection;         /* refuse non-global addresses */
    /* retry */
    int64_t retry_base_ms;      /* full-jitter base, ms */
    int64_t retry_cap_ms;       /* maximum delay, ms */
    int64_t max_attempts;       /* attempts before dead letter */
    int64_t retry_shards;       /* number of Redis retry sorted sets */
    int64_t lease_ms;           /* retry job lease; must exceed http_timeout_ms */
    int64_t retry_after_max_ms; /* upper bound for an honoured Retry-After, ms */
    /* breaker */
    int64_t breaker_threshold;       /* consecutive failures that open the breaker */
    int64_t breaker_slow_threshold;  /* threshold when the endpoint's P95 is slow */
    int64_t breaker_slow_p95_ms;     /* P95 above which an endpoint counts as slow, ms */
    int64_t breaker_cooldown_ms;     /* first cooldown, ms */
    int64_t breaker_cooldown_max_ms; /* cap for the doubled cooldown, ms */
    int64_t disable_after_ms;        /* only failures for this long disable the endpoint;
                                        0 = never (410 still disables), ms */
    /* dedup and shutdown */
    int64_t dedup_window_s;      /* delivered-marker TTL, s */
    bool dedup_fail_open;        /* marker check fails: deliver (true) or hold and pause */
    int64_t shutdown_drain_ms;   /* SIGTERM: time to let in-flight requests finish, ms */
    int64_t shutdown_timeout_ms; /* SIGTERM: bound on the whole exit, ms */
    /* recorder */
    int64_t recorder_batch;             /* rows per COPY batch */
    int64_t recorder_flush_ms;          /* flush a partial batch after this long, ms */
    int64_t recorder_future_max_s;      /* outcome ts ahead of PostgreSQL's clock allowed, s */
    int64_t recorder_lanes;             /* parallel write lanes (PostgreSQL connections) */
    int64_t recorder_batch_max_bytes;   /* encoded bytes that make a batch full, bytes */
    int64_t recorder_health_refresh_ms; /* endpoint_health refresh interval (at least), ms */
    int64_t latency_window_h;           /* rolling window of latency samples, hours */
    int64_t dead_letter_retention_d;    /* dead letters kept this many days */
    int64_t history_retention_d;        /* delivery_attempts partitions kept, days */
    int64_t deliveries_retention_d;     /* deliveries rows kept, days; 0 = history's */
    /* HTTP API (sluice-api) */
    char *api_listen;               /* host:port the API listens on */
    int64_t api_threads;            /* HTTP worker threads */
    int64_t api_read_threads;       /* threads running the history reads */
    int64_t api_max_connections;    /* open client connections before new ones are refused */
    int64_t api_idle_timeout_s;     /* a connection idle (or stalled mid-request) this long is
                                       closed, s */
    int64_t api_request_timeout_s;  /* a whole request within this of the connection's opening
                                     * or previous answer, else the connection is closed (s) */
    int64_t api_max_request_bytes;  /* largest request body, bytes (413 past it) */
    int64_t api_batch_max;          /* events in one POST /v1/events/batch */
    int64_t api_fanout_max;         /* endpoints one event may fan out to */
    int64_t api_publish_timeout_ms; /* Kafka acknowledgement wait per publish, ms (503 past it) */
    int64_t api_linger_ms;          /* producer linger.ms for publishes, ms */
    int64_t api_idempotency_ttl_s;  /* how long an Idempotency-Key's answer is kept, s */
    int64_t api_key_refresh_ms;     /* API keys reloaded from PostgreSQL this often, ms */
    int64_t api_shutdown_ms;        /* SIGTERM: time allowed for requests in flight, ms */
    /* metrics and probes (every long-running process) */
    char *metrics_listen;         /* host:port of /metrics, /healthz, /readyz; "" = off */
    int64_t metrics_endpoint_top; /* consumer: endpoints with their own series; 0 = none */
    int64_t live_stall_ms;        /* /healthz fails past this long without a loop turn, ms */
    int64_t recorder_ready_lag;   /* recorder: /readyz fails at this lag, records */
    /* bookkeeping */
    unsigned char sources[96]; /* enum sl_cfg_source per option, indexed like the table */
};

/* SL_CFG_SRC_BAD: a value given for it was refused (sl_cfg_load then fails; the checks
 * across options leave it out rather than judge its default) */
enum sl_cfg_source { SL_CFG_SRC_DEFAULT = 0, SL_CFG_SRC_FILE, SL_CFG_SRC_ENV, SL_CFG_SRC_BAD };

/* Load defaults, then file (may be NULL: then SLUICE_CONFIG_FILE if set), then the environment
 * (envp NULL = environ). Errors are appended to errs (one line each, NUL-separated text in a
 * caller buffer would be awkward, so they are printed to errf; NULL = stderr). Returns the
 * number of errors (0 = ok). cfg is always initialised (call sl_cfg_fini). */
int sl_cfg_load(struct sl_config *cfg, const char *file, char *const *envp, FILE *errf);
void sl_cfg_fini(struct sl_config *cfg);

/* Print every option (name, env, type, bounds, default, help). */
void sl_cfg_print_help(FILE *f);
/* Print the effective config, one `name = value  # source` line each, secrets redacted. */
void sl_cfg_print(const struct sl_config *cfg, FILE *f);
/* Markdown reference generated from the table (docs/CONFIG.md). */
void sl_cfg_print_markdown(FILE *f);
/* Source of a loaded option by name; -1 if no such option. */
int sl_cfg_source(const struct sl_config *cfg, const char *name);

/*
 * The common start-up sequence for processes: handles --config FILE, --help-config,
 * --print-config, --check-config, consumes them from argv (argc/argv are rewritten to what
 * is left), loads, and on error prints every problem and exits SL_CFG_EXIT. Registers secret
 * values with the logger and initialises it with proc. Returns only on success.
 */
void sl_cfg_main_load(struct sl_config *cfg, const char *proc, int *argc, char **argv);

/*
 * The start of a long-running process's main() (sluice-consumer, sluice-recorder,
 * sluice-api): --help or -h (usage to stdout) and --version exit 0; an argument that is not
 * a configuration flag exits 2 with usage on stderr; then sl_cfg_main_load, which also
 * checks master_key, which each of them needs to start (present and well-formed): every
 * configuration error is listed, then exit SL_CFG_EXIT (--check-config the same, without
 * starting). Otherwise SIGTERM and SIGINT go to on_stop, SIGPIPE is ignored, and it returns
 * -1: go on (cfg loaded; the caller calls sl_cfg_fini). It never returns 2 now; callers
 * keep returning what it returns when it is >= 0.
 */
int sl_cfg_main_daemon(struct sl_config *cfg,
                       const char *proc,
                       void (*usage)(FILE *f),
                       void (*on_stop)(int sig),
                       int *argc,
                       char **argv);

#endif /* SL_CFG_H */
