/*
 * api_console.h: the web console's files, embedded into sluice-api at build time.
 *
 * api/console_embed.cmake turns every file under api/console/ into one generated C source
 * (console_files.c in the build tree) holding api_console_files[]: the bytes, the
 * Content-Type chosen by extension and an ETag (a prefix of the SHA-256 of the bytes, so a
 * changed file gets a new tag). api_console.c serves them; nothing is read from disk at run
 * time, so the binary is the whole console.
 *
 * thread: read-only data.
 */
#ifndef API_CONSOLE_H
#define API_CONSOLE_H

#include <stddef.h>

struct api_console_file {
    const char *path;          /* URL path: "/console/" + the file's path under api/console */
    const unsigned char *data; /* the bytes (followed by a NUL not counted in len) */
    size_t len;                /* bytes */
    const char *type;          /* Content-Type */
    const char *etag;          /* strong ETag, quoted: "\"0123456789abcdef\"" */
};

extern const struct api_console_file api_console_files[]; /* sorted by path */
extern const size_t api_console_nfiles;                   /* entries in api_console_files */

#endif /* API_CONSOLE_H */
