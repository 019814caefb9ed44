/*
 * sl_mem: allocation that never returns NULL. Out-of-memory logs the size it tried and
 * aborts (outside data can never cause it: every input-driven size is capped before it
 * reaches an allocator). Also bounded buffers (sl_buf) whose growth past their maximum
 * fails cleanly instead of allocating.
 *
 * thread: any.
 */
#ifndef SL_MEM_H
#define SL_MEM_H

#include <stddef.h>
#include <stdint.h>

void *sl_xmalloc(size_t n);
void *sl_xcalloc(size_t nmemb, size_t size);
void *sl_xrealloc(void *p, size_t n);
char *sl_xstrdup(const char *s);
char *sl_xstrndup(const char *s, size_t n);
/* Copy n strings (borrowed) into one allocation: the pointer array, then the strings; free
 * the result with free(). NULL when n is 0. */
char **sl_strv_dup(const char *const *v, size_t n);

/*
 * Serve every allocation of at least `bytes` with its own mapping, returned to the system
 * when freed (glibc's M_MMAP_THRESHOLD, pinned: glibc otherwise raises the threshold to the
 * size of each mapped block freed, up to 32 MiB, and then serves such blocks from its heaps).
 * For processes that consume Kafka: librdkafka 2.0.2 decompresses each LZ4 batch into a
 * buffer of 4 times its compressed size (the frames its producers write carry no content
 * size) and keeps the buffer until the last record from it is destroyed, so the pre-fetch
 * queue holds several times its configured bytes; in a mapping of its own, the part never
 * written is never resident (bench/README.md, "Consumer memory"). Call before starting
 * threads. Returns 1 if set, 0 where the C library has no such setting.
 */
int sl_mem_pin_mmap_threshold(size_t bytes);

/* The threshold the processes that consume Kafka pin: glibc's initial M_MMAP_THRESHOLD. */
#define SL_MEM_MMAP_THRESHOLD_BYTES ((size_t)128 * 1024)

/* Overwrite n bytes at p in a way the compiler cannot elide (for secrets). NULL-safe. */
void sl_secret_wipe(void *p, size_t n);

/* A growable byte buffer with a hard maximum. Caller-allocated; sl_buf_fini frees. */
struct sl_buf {
    uint8_t *data; /* NULL until first append; always NUL-terminated after an append */
    size_t len;    /* bytes used */
    size_t cap;    /* bytes allocated (excluding the NUL) */
    size_t max;    /* hard limit on len; appends past it fail */
};

void sl_buf_init(struct sl_buf *b, size_t max);
/* Append n bytes; returns 0, or SL_ETOOBIG (buffer unchanged) past the maximum. */
int sl_buf_append(struct sl_buf *b, const void *p, size_t n);
int sl_buf_append_str(struct sl_buf *b, const char *s);
int sl_buf_printf(struct sl_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sl_buf_reset(struct sl_buf *b); /* len = 0, memory kept */
void sl_buf_fini(struct sl_buf *b);  /* frees; b can be re-initialised */

#endif /* SL_MEM_H */
