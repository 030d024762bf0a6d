/* SPDX-License-Identifier: MIT */
/*
 * metrics_http.c: `stash serve --metrics ADDR:PORT`: the arena's metrics at
 * /metrics over HTTP (libmicrohttpd, one thread of its own), for a
 * Prometheus scrape. Whoever reaches the port may connect, so the server
 * holds few descriptors whatever clients do: a few connections in all, fewer
 * per client address, and none idle for long.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>

#include "include/stash.h"
#include "tools/tools.h"

/* At most this many connections at once (the server's descriptors: these,
 * the listening socket and one for its thread's wake-ups); more wait in the
 * kernel's backlog until one closes. A scrape needs one. */
#define METRICS_CONNECTIONS 32u
/* At most this many of them from one client address: more are closed at
 * once, so that one client cannot take the others' turn. */
#define METRICS_PER_CLIENT 4u
/* A connection that neither sends nor takes a byte for this many seconds
 * is closed. */
#define METRICS_IDLE_SECONDS 5u

struct tool_metrics_server {
    struct MHD_Daemon *d;
    stash_arena *a;
};

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned status, const char *type,
                             char *body, size_t len)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result rc = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result answer(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **req)
{
    (void)version, (void)upload, (void)upload_size, (void)req;
    tool_metrics_server *s = cls;
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
        return reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain", strdup("GET only\n"), 9);
    if (strcmp(url, "/metrics") != 0)
        return reply(conn, MHD_HTTP_NOT_FOUND, "text/plain", strdup("see /metrics\n"), 13);
    const char *kg = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "kg");
    char *body = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&body, &len);
    if (!f) return MHD_NO;
    int rc = tool_metrics(f, s->a, kg && strcmp(kg, "1") == 0);
    fclose(f);
    if (rc < 0) {
        free(body);
        return reply(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "text/plain", strdup("no memory\n"), 10);
    }
    return reply(conn, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", body, len);
}

/* PORT: decimal digits alone, 0 to 65535 (strtoul would take a sign, a
 * space or more, and getaddrinfo wraps what is larger). */
static int parse_port(const char *p, uint16_t *port)
{
    unsigned v = 0;
    if (!*p) return -EINVAL;
    for (; *p; p++) {
        if (*p < '0' || *p > '9') return -EINVAL;
        v = v * 10 + (unsigned)(*p - '0');
        if (v > 65535) return -EINVAL;
    }
    *port = (uint16_t)v;
    return 0;
}

/* The address before the port, copied out of s into host; false if longer
 * than any numeric address. */
static bool copy_host(const char *s, size_t len, char *host, size_t cap)
{
    if (len >= cap) return false;
    memcpy(host, s, len);
    host[len] = 0;
    return true;
}

int tool_metrics_address(const char *s, struct sockaddr_storage *out, const char **why)
{
    char host[INET6_ADDRSTRLEN];
    uint16_t port;
    const char *colon;
    memset(out, 0, sizeof *out);
    if (s[0] == '[') {
        struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)out;
        const char *end = strchr(s, ']');
        if (!end || end[1] != ':') return *why = "not [IPV6]:PORT", -EINVAL;
        colon = end + 1;
        a6->sin6_family = AF_INET6;
        if (!copy_host(s + 1, (size_t)(end - s - 1), host, sizeof host) ||
            inet_pton(AF_INET6, host, &a6->sin6_addr) != 1)
            return *why = "the address in brackets is not a numeric IPv6 address", -EINVAL;
        if (parse_port(colon + 1, &port) < 0)
            return *why = "the port is not a number from 0 to 65535", -EINVAL;
        a6->sin6_port = htons(port);
        return 0;
    }
    struct sockaddr_in *a4 = (struct sockaddr_in *)out;
    colon = strrchr(s, ':');
    if (!colon) return *why = "not ADDR:PORT, :PORT or [IPV6]:PORT", -EINVAL;
    if (memchr(s, ':', (size_t)(colon - s)))
        return *why = "an IPv6 address goes in brackets: [IPV6]:PORT", -EINVAL;
    a4->sin_family = AF_INET;
    /* :PORT is every IPv4 address, as Prometheus exporters read it. */
    a4->sin_addr.s_addr = htonl(INADDR_ANY);
    /* inet_pton, not inet_aton: 127.1 and 0x7f.1 are no addresses here. */
    if (colon > s && (!copy_host(s, (size_t)(colon - s), host, sizeof host) ||
                      inet_pton(AF_INET, host, &a4->sin_addr) != 1))
        return *why = "the address is not a numeric IPv4 address A.B.C.D (names are not looked up)",
               -EINVAL;
    if (parse_port(colon + 1, &port) < 0)
        return *why = "the port is not a number from 0 to 65535", -EINVAL;
    a4->sin_port = htons(port);
    return 0;
}

int tool_metrics_serve(const struct sockaddr_storage *addr, stash_arena *a,
                       tool_metrics_server **out, char *where, size_t size)
{
    tool_metrics_server *s = calloc(1, sizeof *s);
    if (!s) return -ENOMEM;
    s->a = a;
    bool v6 = addr->ss_family == AF_INET6;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | (v6 ? MHD_USE_IPv6 : 0);
    errno = 0;
    struct MHD_OptionItem limits[] = {
        {MHD_OPTION_CONNECTION_LIMIT, METRICS_CONNECTIONS, NULL},
        {MHD_OPTION_PER_IP_CONNECTION_LIMIT, METRICS_PER_CLIENT, NULL},
        {MHD_OPTION_CONNECTION_TIMEOUT, METRICS_IDLE_SECONDS, NULL},
        {MHD_OPTION_END, 0, NULL},
    };
    s->d =
        MHD_start_daemon(flags, 0, NULL, NULL, answer, s, MHD_OPTION_SOCK_ADDR,
                         (const struct sockaddr *)addr, MHD_OPTION_ARRAY, limits, MHD_OPTION_END);
    if (!s->d) {
        int err = errno ? errno : EADDRINUSE;
        free(s);
        return -err;
    }
    char numeric[INET6_ADDRSTRLEN] = "";
    if (v6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)addr)->sin6_addr, numeric,
                  sizeof numeric);
    else
        inet_ntop(AF_INET, &((const struct sockaddr_in *)addr)->sin_addr, numeric, sizeof numeric);
    const union MHD_DaemonInfo *port = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    snprintf(where, size, "http://%s%s%s:%u/metrics", v6 ? "[" : "", numeric, v6 ? "]" : "",
             port ? port->port : 0u);
    *out = s;
    return 0;
}

void tool_metrics_stop(tool_metrics_server *s)
{
    if (!s) return;
    MHD_stop_daemon(s->d);
    free(s);
}
