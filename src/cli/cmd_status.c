/* `tycho status`: a running server's state (GET /status of tycho-conductor or `tycho serve`):
 * requests in flight, the scheduler's policy, SLO classes and cost model in force, and every
 * node with its load, as tables a person reads or the server's JSON (--json) for scripts.
 * Exit 0 when the server answered, 1 when it could not be reached or refused, 2 usage. */
#include "cli.h"

#include <getopt.h>
#include <jansson.h>
#include <netdb.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tycho status [--url http://127.0.0.1:8000] [--api-key KEY] [--json]\n"
            "         [--timeout-ms N]\n"
            "Show a running tycho-conductor's (or tycho serve's) state: requests in flight, the\n"
            "scheduler's policy, SLO classes and cost model, and each node's load.\n"
            "The key is also read from TYCHO_API_KEY.\n");
}

/* host and port of an http:// URL (no path; IPv6 in brackets). */
static int parse_url(const char *url, char *host, size_t hcap, char *port, size_t pcap)
{
    const char *p = strncmp(url, "http://", 7) ? url : url + 7;
    const char *end = p + strcspn(p, "/");
    const char *colon = NULL;
    if (*p == '[') {
        const char *rb = memchr(p, ']', (size_t)(end - p));
        if (!rb)
            return -1;
        snprintf(host, hcap, "%.*s", (int)(rb - p - 1), p + 1);
        colon = rb[1] == ':' ? rb + 1 : NULL;
    } else {
        colon = memchr(p, ':', (size_t)(end - p));
        snprintf(host, hcap, "%.*s", (int)((colon ? colon : end) - p), p);
    }
    snprintf(port, pcap, "%.*s", colon ? (int)(end - colon - 1) : 2, colon ? colon + 1 : "80");
    return host[0] && port[0] ? 0 : -1;
}

/* GET path; the body of a 200 answer (malloc'd) or NULL with why. */
static char *http_get(const char *host, const char *port, const char *path, const char *key,
                      int timeout_ms, char *why, size_t cap)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai;
    int rc = getaddrinfo(host, port, &hints, &ai);
    if (rc) {
        snprintf(why, cap, "%s:%s: %s", host, port, gai_strerror(rc));
        return NULL;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen)) {
        snprintf(why, cap, "cannot connect to %s:%s (is the server running?)", host, port);
        if (fd >= 0)
            close(fd);
        freeaddrinfo(ai);
        return NULL;
    }
    freeaddrinfo(ai);
    char req[1024];
    int n = snprintf(req, sizeof(req),
                     "GET %s HTTP/1.0\r\nHost: %s\r\n%s%s%sConnection: close\r\n\r\n", path,
                     host, key ? "Authorization: Bearer " : "", key ? key : "", key ? "\r\n" : "");
    if (n < 0 || (size_t)n >= sizeof(req) || write(fd, req, (size_t)n) != n) {
        snprintf(why, cap, "cannot send the request");
        close(fd);
        return NULL;
    }
    size_t len = 0, bcap = 1 << 16;
    char *buf = malloc(bcap + 1);
    for (;;) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (!buf || poll(&pf, 1, timeout_ms) <= 0) {
            snprintf(why, cap, buf ? "no answer within %d ms" : "out of memory", timeout_ms);
            free(buf);
            close(fd);
            return NULL;
        }
        if (len == bcap) {
            char *nb = realloc(buf, 2 * bcap + 1);
            if (!nb) {
                free(buf);
                buf = NULL;
                continue;
            }
            buf = nb;
            bcap *= 2;
        }
        ssize_t got = read(fd, buf + len, bcap - len);
        if (got <= 0)
            break;
        len += (size_t)got;
    }
    close(fd);
    buf[len] = 0;
    int status = 0;
    char *body = strstr(buf, "\r\n\r\n");
    if (sscanf(buf, "HTTP/%*s %d", &status) != 1 || !body) {
        snprintf(why, cap, "not an HTTP answer from %s:%s", host, port);
        free(buf);
        return NULL;
    }
    body += 4;
    if (status != 200) {
        json_t *e = json_loads(body, 0, NULL);
        const char *msg = json_string_value(json_object_get(json_object_get(e, "error"),
                                                            "message"));
        snprintf(why, cap, "HTTP %d%s%s%s", status, msg ? ": " : "", msg ? msg : "",
                 status == 404 ? " (a server without /status: an older Tycho?)" : "");
        json_decref(e);
        free(buf);
        return NULL;
    }
    memmove(buf, body, strlen(body) + 1);
    return buf;
}

static double num(const json_t *o, const char *k)
{
    return json_number_value(json_object_get(o, k));
}

static const char *str(const json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "-";
}

static void print_scheduler(const json_t *s)
{
    printf("scheduler: %s, admission %s, balancing threshold %g, %.0f in flight, %.0f blocks "
           "indexed, decode duration %.1f s\n",
           str(s, "policy"), str(s, "admission"), num(s, "balancing_threshold"),
           num(s, "in_flight"), num(s, "index_blocks"), num(s, "decode_duration_s"));
    printf("\n%-20s %9s %9s %9s %9s %12s %12s\n", "SLO class", "TTFT s", "TBT s", "accepted",
           "refused", "TTFT met", "TBT met");
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(s, "classes"), i, c) {
        char t[2][16], met[2][32];
        double v[2] = {num(c, "ttft_s"), num(c, "tbt_s")};
        const char *key[2][2] = {{"ttft_met", "ttft_missed"}, {"tbt_met", "tbt_missed"}};
        for (int k = 0; k < 2; k++) {
            snprintf(t[k], sizeof(t[k]), v[k] > 0 ? "%.3f" : "none", v[k]);
            double ok = num(c, key[k][0]), all = ok + num(c, key[k][1]);
            if (v[k] > 0 && all > 0)
                snprintf(met[k], sizeof(met[k]), "%.1f%% of %.0f", 100 * ok / all, all);
            else
                snprintf(met[k], sizeof(met[k]), "-");
        }
        printf("%-20s %9s %9s %9.0f %9.0f %12s %12s%s\n", str(c, "name"), t[0], t[1],
               num(c, "accepted"), num(c, "refused"), met[0], met[1], i ? "" : "  (default)");
    }
    json_t *cost = json_object_get(s, "cost");
    json_t *p = json_object_get(cost, "prefill_us"), *d = json_object_get(cost, "decode_us");
    printf("\ncost model (%s, %.0f prefill / %.0f decode samples):\n",
           json_is_true(json_object_get(cost, "refit")) ? "refitted from the nodes' timings"
                                                        : "fixed",
           num(cost, "prefill_samples"), num(cost, "decode_samples"));
    printf("  prefill call  %.1f us + %.4g us x new tokens + %.4g us x (L^2 - P^2)\n",
           json_number_value(json_array_get(p, 0)), json_number_value(json_array_get(p, 1)),
           json_number_value(json_array_get(p, 2)));
    printf("  decode step   %.1f us + %.4g us x sequences + %.4g us x context tokens\n",
           json_number_value(json_array_get(d, 0)), json_number_value(json_array_get(d, 1)),
           json_number_value(json_array_get(d, 2)));
    printf("  KV transfer   %.3g GB/s, %.0f bytes per token\n", num(cost, "net_gbytes_per_s"),
           num(cost, "kv_bytes_per_token"));
    printf("  first token   + %.1f ms (RPCs, KV handoff, the way back: learned from measured "
           "TTFTs)\n", num(cost, "ttft_overhead_us") / 1e3);
    json_t *pred = json_object_get(cost, "prediction");
    if (!pred)
        return; /* an older Conductor */
    char m[2][48];
    for (int k = 0; k < 2; k++) {
        const json_t *e = json_object_get(pred, k ? "tbt" : "ttft");
        const json_t *r = json_object_get(e, "median_ratio");
        if (json_is_number(r))
            snprintf(m[k], sizeof(m[k]), "x%.3g (of %.0f)", json_number_value(r),
                     num(e, "requests"));
        else
            snprintf(m[k], sizeof(m[k]), "-");
    }
    printf("  predicted     TTFT %s, TBT %s: median predicted / measured of the latest "
           "requests; %.0f probes\n", m[0], m[1], num(cost, "probes"));
}

static void print_nodes(const json_t *nodes)
{
    printf("\n%-20s %-8s %-22s %-9s %8s %8s %8s %8s %10s %7s %8s %9s\n", "node", "role",
           "address", "state", "inflight", "served", "running", "queued", "queue s", "kv use",
           "preempt", "heartbeat");
    size_t i;
    json_t *n;
    json_array_foreach(nodes, i, n) {
        bool prefill = !strcmp(str(n, "role"), "prefill");
        char q[16] = "-", hb[16] = "-", pre[24] = "-";
        if (prefill)
            snprintf(q, sizeof(q), "%.3f", num(n, "predicted_queue_s"));
        else
            snprintf(pre, sizeof(pre), "%.0f", num(n, "preemptions"));
        if (json_is_number(json_object_get(n, "heartbeat_age_s")))
            snprintf(hb, sizeof(hb), "%.1f s", num(n, "heartbeat_age_s"));
        /* up, down, or up but out of placement by its circuit breaker */
        const char *brk = json_string_value(json_object_get(n, "breaker"));
        const char *state = !json_is_true(json_object_get(n, "alive")) ? "down"
                            : brk && !strcmp(brk, "open")            ? "failing"
                            : brk && !strcmp(brk, "half_open")       ? "probing"
                                                                     : "up";
        printf("%-20s %-8s %-22s %-9s %8.0f %8.0f %8.0f %8.0f %10s %6.1f%% %8s %9s\n",
               str(n, "id"), str(n, "role"), str(n, "address"),
               state, num(n, "in_flight"),
               num(n, "served"), num(n, "running"), num(n, "queued"), q,
               100 * num(n, "kv_usage"), pre, hb);
    }
    if (!json_array_size(nodes))
        printf("(no node registered)\n");
}

static int run_status(int argc, char **argv)
{
    static const struct option lo[] = {{"url", 1, 0, 'u'},        {"api-key", 1, 0, 'k'},
                                       {"json", 0, 0, 'j'},       {"timeout-ms", 1, 0, 't'},
                                       {"help", 0, 0, 'h'},       {0, 0, 0, 0}};
    const char *url = "http://127.0.0.1:8000", *key = getenv("TYCHO_API_KEY");
    bool as_json = false;
    int timeout_ms = 3000, ch;
    while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (ch) {
        case 'u': url = optarg; break;
        case 'k': key = optarg; break;
        case 'j': as_json = true; break;
        case 't':
            if (sscanf(optarg, "%d", &timeout_ms) != 1 || timeout_ms <= 0) {
                fprintf(stderr, "status: bad --timeout-ms %s\n", optarg);
                return TY_CLI_EXIT_USAGE;
            }
            break;
        case 'h': usage(stdout); return TY_CLI_EXIT_OK;
        default: usage(stderr); return TY_CLI_EXIT_USAGE;
        }
    }
    char host[256], port[16], why[512];
    if (optind < argc || parse_url(url, host, sizeof(host), port, sizeof(port))) {
        usage(stderr);
        return TY_CLI_EXIT_USAGE;
    }
    if (key && !key[0])
        key = NULL;
    char *body = http_get(host, port, "/status", key, timeout_ms, why, sizeof(why));
    if (!body) {
        fprintf(stderr, "tycho status: %s\n", why);
        return TY_CLI_EXIT_FAIL;
    }
    json_error_t je;
    json_t *o = json_loads(body, 0, &je);
    if (!json_is_object(o)) {
        fprintf(stderr, "tycho status: the answer is not a JSON object (%s)\n", je.text);
        free(body);
        json_decref(o);
        return TY_CLI_EXIT_FAIL;
    }
    if (as_json) {
        puts(body);
    } else {
        printf("%s %s: model %s, up %.0f s%s, %.0f request(s) in flight, %.0f running, %.0f "
               "waiting, KV %.1f %% used, %.0f preemption(s)\n",
               json_object_get(o, "scheduler") ? "tycho-conductor" : "tycho serve", url,
               str(o, "model"), num(o, "uptime_s"),
               json_is_true(json_object_get(o, "draining")) ? " (draining)" : "",
               num(o, "in_flight"), num(o, "running"), num(o, "waiting"),
               100 * num(o, "kv_usage"), num(o, "preemptions"));
        const json_t *pool = json_object_get(o, "kv_pool");
        if (json_is_object(pool))
            printf("KV pool: master %s, %s\n", str(pool, "master"),
                   json_is_true(json_object_get(pool, "following")) ? "following its blocks"
                                                                     : "not following (down?)");
        const json_t *eng = json_object_get(o, "engine");
        if (json_is_object(eng))
            printf("engine: %s backend, KV %s, %.0f pages of %.0f tokens, up to %.0f running / "
                   "%.0f waiting, %.0f tokens per step, %.0f steps run\n",
                   str(eng, "backend"), str(eng, "kv_cache_dtype"), num(eng, "kv_pages"),
                   num(eng, "kv_block_tokens"), num(eng, "max_running"), num(eng, "max_waiting"),
                   num(eng, "max_batch_tokens"), num(eng, "steps"));
        if (json_object_get(o, "scheduler"))
            print_scheduler(json_object_get(o, "scheduler"));
        if (json_object_get(o, "nodes"))
            print_nodes(json_object_get(o, "nodes"));
    }
    json_decref(o);
    free(body);
    return TY_CLI_EXIT_OK;
}

const struct ty_cli_command ty_cli_cmd_status = {
    "status", "show a running server's requests, scheduler settings and nodes", run_status};
