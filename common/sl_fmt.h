/*
 * sl_fmt: a bounded text writer for the short lines the delivery path builds several times
 * per delivery (Redis keys, marker values, header lines, the signature's "id.ts." prefix).
 * glibc's snprintf spends 800-1,000 instructions on such a line, ten of them per delivery
 * (bench/README.md, "Consumer CPU"); these append strings and decimal integers directly.
 *
 *   struct sl_fmt f;
 *   sl_fmt_init(&f, buf, cap);
 *   sl_fmt_str(&f, "sluice:done:{"); sl_fmt_str(&f, endpoint_id); ...
 *   int n = sl_fmt_end(&f);      length, or -1 (buf "") when it did not fit
 *
 * A writer that runs out of room stops writing and remembers it; sl_fmt_end then reports
 * -1, like snprintf's result >= cap. Integers are written as printf's %llu / %lld would.
 *
 * thread: any; the writer is the caller's.
 */
#ifndef SL_FMT_H
#define SL_FMT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct sl_fmt {
    char *buf;  /* start of the caller's buffer */
    size_t cap; /* its size in bytes (room for the NUL included) */
    size_t len; /* bytes written */
    bool over;  /* something did not fit: nothing more is written */
};

/* Start writing into buf (cap bytes; cap 0 allowed: everything is then "over"). */
void sl_fmt_init(struct sl_fmt *f, char *buf, size_t cap);

/* Append n bytes of s. */
void sl_fmt_mem(struct sl_fmt *f, const void *s, size_t n);

/* Append the NUL-terminated s. */
void sl_fmt_str(struct sl_fmt *f, const char *s);

/* Append v in decimal. */
void sl_fmt_u64(struct sl_fmt *f, uint64_t v);

/* Append v in decimal, with '-' when negative. */
void sl_fmt_i64(struct sl_fmt *f, int64_t v);

/* NUL-terminate; returns the length, or -1 (buf "" when cap > 0) when the text did not fit
 * with its NUL. */
int sl_fmt_end(struct sl_fmt *f);

#endif /* SL_FMT_H */
