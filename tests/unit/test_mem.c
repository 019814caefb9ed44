/*
 * Unit tests for common/sl_mem: the bounded buffer (growth, the hard maximum leaves the buffer
 * unchanged, NUL termination, printf, reset keeps memory), sl_secret_wipe and the pinned mmap
 * threshold (glibc's allocator; under ASan, whose allocator replaces it, that test is skipped
 * and says so).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANITIZED_MALLOC 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED_MALLOC 1
#endif

#include "common/sl_err.h"
#include "common/sl_mem.h"

static void test_buf_grows_and_terminates(void **state)
{
    (void)state;
    struct sl_buf b;
    sl_buf_init(&b, 1 << 20);
    assert_null(b.data);
    for (int i = 0; i < 1000; i++)
        assert_int_equal(sl_buf_append(&b, "0123456789", 10), 0);
    assert_int_equal(b.len, 10000);
    assert_true(b.cap >= b.len);
    assert_int_equal(b.data[b.len], '\0');
    assert_memory_equal(b.data + 9990, "0123456789", 10);
    sl_buf_fini(&b);
    assert_null(b.data);
}

static void test_buf_maximum_leaves_it_unchanged(void **state)
{
    (void)state;
    struct sl_buf b;
    sl_buf_init(&b, 8);
    assert_int_equal(sl_buf_append_str(&b, "abcdef"), 0);
    assert_int_equal(sl_buf_append_str(&b, "xyz"), SL_ETOOBIG); /* 9 > 8 */
    assert_int_equal(b.len, 6);
    assert_string_equal((const char *)b.data, "abcdef");
    assert_int_equal(sl_buf_append_str(&b, "gh"), 0); /* exactly the maximum */
    assert_string_equal((const char *)b.data, "abcdefgh");
    assert_int_equal(sl_buf_printf(&b, "%d", 1), SL_ETOOBIG);
    assert_string_equal((const char *)b.data, "abcdefgh");
    sl_buf_fini(&b);
}

static void test_buf_printf_and_reset(void **state)
{
    (void)state;
    struct sl_buf b;
    sl_buf_init(&b, 4096);
    assert_int_equal(sl_buf_printf(&b, "%s=%d;", "attempt", 3), 0);
    /* longer than any first guess of the formatted size */
    char big[2000];
    memset(big, 'z', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    assert_int_equal(sl_buf_printf(&b, "%s", big), 0);
    assert_int_equal(b.len, strlen("attempt=3;") + sizeof(big) - 1);
    assert_memory_equal(b.data, "attempt=3;zzz", 13);
    size_t cap = b.cap;
    uint8_t *data = b.data;
    sl_buf_reset(&b);
    assert_int_equal(b.len, 0);
    assert_int_equal(b.cap, cap);
    assert_ptr_equal(b.data, data);
    assert_int_equal(sl_buf_append_str(&b, "again"), 0);
    assert_string_equal((const char *)b.data, "again");
    sl_buf_fini(&b);
}

static void test_secret_wipe(void **state)
{
    (void)state;
    unsigned char key[64];
    memset(key, 0xA5, sizeof(key));
    sl_secret_wipe(key + 8, 48);
    for (size_t i = 0; i < sizeof(key); i++)
        assert_int_equal(key[i], i >= 8 && i < 56 ? 0 : 0xA5);
    sl_secret_wipe(NULL, 10); /* NULL-safe */
    sl_secret_wipe(key, 0);
    assert_int_equal(key[0], 0xA5);
}

#if !defined(SANITIZED_MALLOC) && defined(__GLIBC__)
static void *volatile sink;
#endif

/* Once a mapped block of 4 MiB is freed, glibc serves a 512 KiB block from its heap (its
 * dynamic threshold rose to 4 MiB); pinned at 128 KiB, the 512 KiB block is mapped. */
static void test_pinned_mmap_threshold_maps_large_blocks(void **state)
{
    (void)state;
#if defined(SANITIZED_MALLOC) || !defined(__GLIBC__)
    skip(); /* not glibc's allocator: nothing to observe */
#else
    assert_int_equal(sl_mem_pin_mmap_threshold(SL_MEM_MMAP_THRESHOLD_BYTES), 1);
    char *big = malloc((size_t)4 << 20);
    assert_non_null(big);
    big[0] = 1;
    sink = big; /* the allocations happen: nothing may elide them */
    free(big);
    struct mallinfo2 before = mallinfo2();
    char *p = malloc((size_t)512 * 1024);
    assert_non_null(p);
    p[0] = 1;
    sink = p;
    struct mallinfo2 during = mallinfo2();
    assert_int_equal(during.hblks, before.hblks + 1);
    assert_true(during.hblkhd >= before.hblkhd + (size_t)512 * 1024);
    free(p);
    assert_int_equal(mallinfo2().hblks, before.hblks); /* unmapped at once */
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_buf_grows_and_terminates),
        cmocka_unit_test(test_buf_maximum_leaves_it_unchanged),
        cmocka_unit_test(test_buf_printf_and_reset),
        cmocka_unit_test(test_secret_wipe),
        cmocka_unit_test(test_pinned_mmap_threshold_maps_large_blocks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
