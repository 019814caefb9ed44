/*
 * api_console: GET /console and /console/<file>, the web console's static files (embedded at
 * build time, see api_console.h). No key is needed for them: they hold no data. Every piece
 * of data comes from the JSON routes, which the page calls with the key the user typed
 * (kept in the tab's sessionStorage, sent as Authorization: Bearer, never in a URL).
 *
 * Every answer of these routes, errors included, carries a strict Content-Security-Policy
 * (same origin only, no inline script or style, no framing) and nosniff; files are answered
 * with their ETag and "Cache-Control: no-cache", so a browser revalidates and gets a 304
 * until sluice-api is rebuilt with a changed file.
 */
#include "api/api_console.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "api/api.h"

static const char console_csp[] =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'";

static const char *const console_headers[] = {"Content-Security-Policy",
                                              console_csp,
                                              "X-Content-Type-Options",
                                              "nosniff",
                                              "Referrer-Policy",
                                              "no-referrer",
                                              "X-Frame-Options",
                                              "DENY",
                                              "Cross-Origin-Opener-Policy",
                                              "same-origin",
                                              "Cache-Control",
                                              "no-cache",
                                              NULL};

#define NHEADERS (sizeof(console_headers) / sizeof(console_headers[0]) - 1)

/* Per file: the console headers plus its ETag, built once (process lifetime, read-only). */
static const char **file_headers;
static pthread_once_t file_headers_once = PTHREAD_ONCE_INIT;

static void build_file_headers(void)
{
    size_t stride = NHEADERS + 3; /* + "ETag", its value, NULL */
    file_headers = sl_xcalloc(api_console_nfiles * stride, sizeof(*file_headers));
    for (size_t i = 0; i < api_console_nfiles; i++) {
        const char **h = file_headers + i * stride;
        memcpy(h, console_headers, NHEADERS * sizeof(*h));
        h[NHEADERS] = "ETag";
        h[NHEADERS + 1] = api_console_files[i].etag;
        h[NHEADERS + 2] = NULL;
    }
}

/* The file at path, or NULL; *idx OUT its index. */
static const struct api_console_file *find(const char *path, size_t *idx)
{
    for (size_t i = 0; i < api_console_nfiles; i++) {
        if (strcmp(api_console_files[i].path, path) == 0) {
            *idx = i;
            return &api_console_files[i];
        }
    }
    return NULL;
}

/* Does If-None-Match (a list of tags, or "*") name tag? */
static bool etag_matches(const char *inm, const char *tag)
{
    if (!inm)
        return false;
    if (strcmp(inm, "*") == 0)
        return true;
    /* a weak comparison (RFC 9110 13.1.2): W/"x" matches "x" */
    size_t n = strlen(tag);
    for (const char *p = strstr(inm, tag); p; p = strstr(p + 1, tag)) {
        char after = p[n];
        if (after == '\0' || after == ',' || after == ' ')
            return true;
    }
    return false;
}

enum api_hret api_console_get(struct api_req *r)
{
    r->headers = console_headers;
    /* "/console" and "/console/" are the endpoints page */
    const char *rest = r->params[0] ? r->params[0] : "";
    char path[256];
    int n = snprintf(path, sizeof(path), "/console/%s", rest[0] ? rest : "index.html");
    size_t idx = 0;
    const struct api_console_file *f = n > 0 && (size_t)n < sizeof(path) ? find(path, &idx) : NULL;
    if (!f)
        return api_problem(r, 404, "not-found", NULL, "no such console file");
    pthread_once(&file_headers_once, build_file_headers);
    r->headers = file_headers + idx * (NHEADERS + 3);
    if (etag_matches(api_header(r, "If-None-Match"), f->etag)) {
        r->status = 304;
        r->raw = "";
        r->raw_len = 0;
        r->raw_type = NULL;
    } else {
        r->status = 200;
        r->raw = (const char *)f->data;
        r->raw_len = f->len;
        r->raw_type = f->type;
    }
    return API_DONE;
}
