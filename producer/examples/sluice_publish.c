/*
 * sluice-publish: the smallest complete program on libsluice_producer (producer/README.md),
 * built against an installed copy with pkg-config or with CMake's find_package.
 *
 *   sluice-publish [-c NAME=VALUE]... ENDPOINT TYPE BODY
 *       publish one delivery (BODY sent byte for byte) and wait for Kafka's acknowledgement
 *   sluice-publish --version
 *
 * Options come from the SLUICE_* environment, as for every Sluice process
 * (SLUICE_KAFKA_BROKERS, SLUICE_TOPIC_DELIVERIES, ...), then from each -c in order.
 * Exit: 0 acknowledged; 1 refused or not acknowledged; 2 usage; 78 bad configuration.
 *
 * thread: single-threaded; the done callback runs inside flush or destroy, on this thread.
 */
#include <sluice_producer.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define EXIT_USAGE  2
#define EXIT_CONFIG 78    /* EX_CONFIG, as Sluice's processes */
#define WAIT_MS     30000 /* ms Kafka may take to acknowledge the record */

/* What the done callback reports (exactly once per accepted publish). */
struct outcome {
    int reported;     /* done has run */
    int status;       /* 0 = acknowledged, else a SLUICE_E* code */
    char reason[256]; /* why not, when status != 0 */
};

static void on_done(void *opaque, int status, const char *reason)
{
    struct outcome *o = opaque;
    o->reported = 1;
    o->status = status;
    if (reason)
        (void)snprintf(o->reason, sizeof(o->reason), "%s", reason);
}

static int usage(void)
{
    (void)fprintf(stderr, "usage: sluice-publish [-c NAME=VALUE]... ENDPOINT TYPE BODY\n"
                          "       sluice-publish --version\n");
    return EXIT_USAGE;
}

/* Apply the environment, then every -c NAME=VALUE of argv[1..*first-1]. */
static int configure(sluice_config_t *cfg, int argc, char **argv, int *first, sluice_err_t *err)
{
    if (sluice_config_load_env(cfg, err) != 0)
        return err->code;
    int i = 1;
    for (; i + 1 < argc && strcmp(argv[i], "-c") == 0; i += 2) {
        char name[64];
        const char *eq = strchr(argv[i + 1], '=');
        size_t n = eq ? (size_t)(eq - argv[i + 1]) : 0;
        if (n == 0 || n >= sizeof(name)) {
            err->code = SLUICE_ECONFIG;
            snprintf(err->msg, sizeof(err->msg), "expected -c NAME=VALUE, not \"%s\"", argv[i + 1]);
            return err->code;
        }
        memcpy(name, argv[i + 1], n);
        name[n] = '\0';
        if (sluice_config_set(cfg, name, eq + 1, err) != 0)
            return err->code;
    }
    *first = i;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--version") == 0) {
        printf("sluice_producer %s\n", sluice_producer_version());
        return 0;
    }
    sluice_err_t err = {0};
    int first = 0;
    sluice_config_t *cfg = sluice_config_new();
    if (configure(cfg, argc, argv, &first, &err) != 0) {
        fprintf(stderr, "sluice-publish: %s\n", err.msg);
        sluice_config_destroy(cfg);
        return EXIT_CONFIG;
    }
    if (argc - first != 3) {
        sluice_config_destroy(cfg);
        return usage();
    }
    struct sluice_producer_opts opts = {.message_timeout_ms = WAIT_MS, .role = "sluice-publish"};
    sluice_producer_t *p = sluice_producer_new_opts(cfg, &opts, &err);
    sluice_config_destroy(cfg); /* the producer keeps what it needs */
    if (!p) {
        fprintf(stderr, "sluice-publish: %s\n", err.msg);
        return err.code == SLUICE_ECONFIG ? EXIT_CONFIG : 1;
    }

    struct timespec now;
    (void)timespec_get(&now, TIME_UTC);
    uint64_t now_ms = (uint64_t)now.tv_sec * 1000 + (uint64_t)now.tv_nsec / 1000000;
    char id[SLUICE_EVENT_ID_MAX];
    snprintf(id, sizeof(id), "evt_%llu_%09ld", (unsigned long long)now.tv_sec, (long)now.tv_nsec);
    struct sluice_delivery d = {.id = id,
                                .ep = argv[first],
                                .type = argv[first + 1],
                                .ts_ms = now_ms,
                                .body = argv[first + 2],
                                .body_len = strlen(argv[first + 2])};
    struct outcome o = {0};
    if (sluice_producer_publish(p, &d, on_done, &o, &err) != 0) {
        /* refused before Kafka saw it: done will not be called */
        fprintf(stderr, "sluice-publish: cannot publish: %s (%s)\n", err.msg,
                sluice_strerror(err.code));
        sluice_producer_destroy(p);
        return 1;
    }
    (void)sluice_producer_flush(p, WAIT_MS + 5000, NULL); /* done runs in here */
    sluice_producer_destroy(p);         /* or here, as a failure, if Kafka never answered */
    if (!o.reported || o.status != 0) { /* never guess towards success */
        fprintf(stderr, "sluice-publish: %s not acknowledged: %s (%s)\n", id, o.reason,
                sluice_strerror(o.status));
        return 1;
    }
    printf("published %s to endpoint %s\n", id, argv[first]);
    return 0;
}
