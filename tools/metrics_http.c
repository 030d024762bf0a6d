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
#include <netdb.h>
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

int tool_metrics_serve(const char *addr, stash_arena *a, tool_metrics_server **out, char *where,
                       size_t size)
{
    const char *colon = strrchr(addr, ':');
    if (!colon || !colon[1]) return -EINVAL;
    char host[256];
    size_t hlen = (size_t)(colon - addr);
    if (hlen >= sizeof host) return -EINVAL;
    memcpy(host, addr, hlen);
    host[hlen] = 0;
    /* [::1]:9187 names an IPv6 address. */
    char *h = host;
    if (h[0] == '[' && hlen > 1 && h[hlen - 1] == ']') h[hlen - 1] = 0, h++;
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV | AI_PASSIVE},
                    *ai;
    if (getaddrinfo(*h ? h : NULL, colon + 1, &hints, &ai) != 0) return -EINVAL;
    tool_metrics_server *s = calloc(1, sizeof *s);
    if (!s) {
        freeaddrinfo(ai);
        return -ENOMEM;
    }
    s->a = a;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->d = MHD_start_daemon(flags, 0, NULL, NULL, answer, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_CONNECTION_LIMIT, METRICS_CONNECTIONS,
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, METRICS_PER_CLIENT,
                            MHD_OPTION_CONNECTION_TIMEOUT, METRICS_IDLE_SECONDS, MHD_OPTION_END);
    char numeric[INET6_ADDRSTRLEN] = "";
    if (ai->ai_family == AF_INET6)
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr, numeric,
                  sizeof numeric);
    else
        inet_ntop(AF_INET, &((struct sockaddr_in *)ai->ai_addr)->sin_addr, numeric, sizeof numeric);
    bool v6 = ai->ai_family == AF_INET6;
    freeaddrinfo(ai);
    if (!s->d) {
        int err = errno ? errno : EADDRINUSE;
        free(s);
        return -err;
    }
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
