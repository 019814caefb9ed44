/*
 * fuzz_main: standalone main() for the replay builds of the fuzz harnesses (SL_FUZZ_MAIN).
 *
 * Usage: fuzz_<name>_replay PATH...   where each PATH is a file or a directory (its regular
 * files are replayed in name order, non-recursively, like libFuzzer corpus dirs). Every input
 * goes through LLVMFuzzerTestOneInput once; an invariant failure or sanitizer report aborts.
 * Exit status: 0 when every input ran, 1 when a path could not be read or nothing was run.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_common.h"

#ifndef SL_FUZZ_MAIN
#error "fuzz_main.c is only for the replay builds (define SL_FUZZ_MAIN)"
#endif

#define REPLAY_MAX_INPUT (16u * 1024 * 1024) /* bytes; larger files are refused, not truncated */

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf = NULL;
    int rc = -1;
    long n;

    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        return -1;
    }
    if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || (unsigned long)n > REPLAY_MAX_INPUT ||
        fseek(f, 0, SEEK_SET) != 0) {
        fprintf(stderr, "cannot read %s (or larger than %u bytes)\n", path, REPLAY_MAX_INPUT);
        goto out;
    }
    /* Exactly n bytes, no slack: ASan flags any read past the input. */
    buf = malloc(n ? (size_t)n : 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "cannot read %s\n", path);
        goto out;
    }
    (void)LLVMFuzzerTestOneInput(buf, (size_t)n);
    rc = 0;
out:
    free(buf);
    fclose(f);
    return rc;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int run_dir(const char *dir, size_t *count)
{
    DIR *d = opendir(dir);
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    int rc = 0;

    if (!d) {
        fprintf(stderr, "cannot open directory %s\n", dir);
        return -1;
    }
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 256;
            char **nn = realloc(names, cap * sizeof(*names));
            if (!nn)
                abort();
            names = nn;
        }
        names[n] = strdup(de->d_name);
        if (!names[n])
            abort();
        n++;
    }
    closedir(d);
    qsort(names, n, sizeof(*names), cmp_names);
    for (size_t i = 0; i < n; i++) {
        char path[4096];
        struct stat st;
        (void)snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
            if (run_file(path) != 0)
                rc = -1;
            else
                (*count)++;
        }
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv)
{
    size_t count = 0;
    int rc = 0;

    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE|DIR...\n", argv[0]);
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "cannot stat %s\n", argv[i]);
            rc = 1;
        } else if (S_ISDIR(st.st_mode)) {
            if (run_dir(argv[i], &count) != 0)
                rc = 1;
        } else if (run_file(argv[i]) != 0) {
            rc = 1;
        } else {
            count++;
        }
    }
    printf("%s: replayed %zu inputs\n", argv[0], count);
    return rc != 0 || count == 0 ? 1 : 0;
}
