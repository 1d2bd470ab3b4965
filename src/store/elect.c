/* Master election through etcd's v3 JSON gateway (store_elect.h):
 *   POST /v3/lease/grant {"TTL":n}                              -> {"ID":"..."}
 *   POST /v3/kv/txn  compare createRevision(key) == 0, success put(key, value, lease)
 *   POST /v3/lease/keepalive {"ID":id}                          -> {"result":{"TTL":...}}
 *   POST /v3/kv/range {"key":k}, POST /v3/lease/revoke {"ID":id}
 * Keys and values are base64 in JSON, int64s are strings. */
#include "tycho/store_elect.h"

#include "tycho/clock.h"
#include "tycho/errors.h"
#include "tycho/log.h"

#include <curl/curl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ty_store_elect {
    char *endpoint, *key, *value;
    uint32_t ttl_s;
    ty_store_elect_cb on_leader, on_lost;
    void *arg;
    uv_async_t async;
    pthread_t thr;
    atomic_bool stop;
    atomic_int state; /* 0 campaigning, 1 leader (to report), 2 lost (to report) */
    int reported;
    char lease[32];
};

static void b64(const char *in, char *out)
{
    static const char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t n = strlen(in), o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint8_t)in[i] << 16;
        if (i + 1 < n)
            v |= (uint8_t)in[i + 1] << 8;
        if (i + 2 < n)
            v |= (uint8_t)in[i + 2];
        out[o++] = t[(v >> 18) & 63];
        out[o++] = t[(v >> 12) & 63];
        out[o++] = i + 1 < n ? t[(v >> 6) & 63] : '=';
        out[o++] = i + 2 < n ? t[v & 63] : '=';
    }
    out[o] = 0;
}

static int unb64(const char *in, char *out, size_t cap)
{
    size_t o = 0;
    uint32_t v = 0;
    int bits = 0;
    for (; *in && *in != '='; in++) {
        const char *t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        const char *p = strchr(t, *in);
        if (!p)
            return TY_EBADMSG;
        v = v << 6 | (uint32_t)(p - t);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (o + 1 >= cap)
                return TY_ENOSPC;
            out[o++] = (char)((v >> bits) & 0xff);
        }
    }
    out[o] = 0;
    return 0;
}

struct buf {
    char *p;
    size_t n;
};

static size_t on_data(char *d, size_t sz, size_t nm, void *arg)
{
    struct buf *b = arg;
    char *np = realloc(b->p, b->n + sz * nm + 1);
    if (!np)
        return 0;
    memcpy(np + b->n, d, sz * nm);
    b->p = np;
    b->n += sz * nm;
    b->p[b->n] = 0;
    return sz * nm;
}

/* POST body to endpoint+path; *out gets the parsed JSON reply. */
static int post(const char *endpoint, const char *path, const char *body, json_t **out)
{
    char url[512];
    snprintf(url, sizeof(url), "%s%s", endpoint, path);
    CURL *h = curl_easy_init();
    if (!h)
        return TY_ENOMEM;
    struct buf b = {0};
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 1000L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    CURLcode cc = curl_easy_perform(h);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(h);
    *out = (cc == CURLE_OK && status == 200 && b.p) ? json_loads(b.p, 0, NULL) : NULL;
    free(b.p);
    return *out ? 0 : TY_ERPC;
}

static int lease_grant(ty_store_elect_t *e)
{
    char body[64];
    snprintf(body, sizeof(body), "{\"TTL\":%u}", e->ttl_s);
    json_t *r;
    int rc = post(e->endpoint, "/v3/lease/grant", body, &r);
    if (rc != 0)
        return rc;
    const char *id = json_string_value(json_object_get(r, "ID"));
    rc = id ? 0 : TY_ERPC;
    if (id)
        snprintf(e->lease, sizeof(e->lease), "%s", id);
    json_decref(r);
    return rc;
}

/* Create the key under our lease unless it exists. Returns 0 when we created it. */
static int try_lead(ty_store_elect_t *e)
{
    char k[1024], v[1024], body[4096];
    b64(e->key, k);
    b64(e->value, v);
    snprintf(body, sizeof(body),
             "{\"compare\":[{\"target\":\"CREATE\",\"key\":\"%s\",\"createRevision\":\"0\"}],"
             "\"success\":[{\"requestPut\":{\"key\":\"%s\",\"value\":\"%s\",\"lease\":\"%s\"}}]}",
             k, k, v, e->lease);
    json_t *r;
    int rc = post(e->endpoint, "/v3/kv/txn", body, &r);
    if (rc != 0)
        return rc;
    rc = json_is_true(json_object_get(r, "succeeded")) ? 0 : TY_EBUSY;
    json_decref(r);
    return rc;
}

static int keepalive(ty_store_elect_t *e)
{
    char body[96];
    snprintf(body, sizeof(body), "{\"ID\":\"%s\"}", e->lease);
    json_t *r;
    int rc = post(e->endpoint, "/v3/lease/keepalive", body, &r);
    if (rc != 0)
        return rc;
    json_t *res = json_object_get(r, "result");
    const char *ttl = json_string_value(json_object_get(res, "TTL"));
    rc = ttl && atoi(ttl) > 0 ? 0 : TY_ELEASE; /* TTL missing or 0: the lease is gone */
    json_decref(r);
    return rc;
}

static void *elect_thread(void *arg)
{
    ty_store_elect_t *e = arg;
    bool leading = false;
    uint64_t last_ok = 0;
    while (!atomic_load(&e->stop)) {
        if (!leading) {
            if (lease_grant(e) == 0 && try_lead(e) == 0) {
                leading = true;
                last_ok = ty_clock_ms();
                atomic_store(&e->state, 1);
                uv_async_send(&e->async);
            }
        } else if (keepalive(e) == 0) {
            last_ok = ty_clock_ms();
        } else if (ty_clock_ms() - last_ok >= e->ttl_s * 1000ull / 2) {
            /* No renewal for half a TTL: another candidate may lead soon; step down first. */
            atomic_store(&e->state, 2);
            uv_async_send(&e->async);
            break;
        }
        for (int i = 0; i < (leading ? 3 : 2) && !atomic_load(&e->stop); i++)
            ty_sleep_ns(100 * 1000000ull); /* keepalive every 300 ms, campaign every 200 ms */
    }
    return NULL;
}

static void on_async(uv_async_t *a)
{
    ty_store_elect_t *e = a->data;
    int st = atomic_load(&e->state);
    if (st >= 1 && e->reported < 1) {
        e->reported = 1;
        TY_LOG_INFO("store", "elected master through %s (%s = %s)", e->endpoint, e->key, e->value);
        if (e->on_leader)
            e->on_leader(e->arg);
    }
    if (st == 2 && e->reported < 2) {
        e->reported = 2;
        TY_LOG_ERROR("store", "lost the master lease %s: stepping down", e->key);
        if (e->on_lost)
            e->on_lost(e->arg);
    }
}

int ty_store_elect_new(ty_store_elect_t **out, const struct ty_store_elect_opts *o)
{
    if (!o || !o->loop || !o->endpoint || !o->key || !*o->key || !o->value || !*o->value ||
        strlen(o->key) > 256 || strlen(o->value) > 256)
        return TY_EINVAL;
    ty_store_elect_t *e = calloc(1, sizeof(*e));
    TY_ASSERT(e != NULL);
    e->endpoint = strdup(o->endpoint);
    e->key = strdup(o->key);
    e->value = strdup(o->value);
    TY_ASSERT(e->endpoint && e->key && e->value);
    e->ttl_s = o->ttl_s ? o->ttl_s : 3;
    e->on_leader = o->on_leader;
    e->on_lost = o->on_lost;
    e->arg = o->arg;
    uv_async_init(o->loop, &e->async, on_async);
    e->async.data = e;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    pthread_create(&e->thr, NULL, elect_thread, e);
    *out = e;
    return 0;
}

static void on_async_closed(uv_handle_t *h)
{
    ty_store_elect_t *e = h->data;
    free(e->endpoint);
    free(e->key);
    free(e->value);
    free(e);
}

void ty_store_elect_free(ty_store_elect_t *e)
{
    if (!e)
        return;
    atomic_store(&e->stop, true);
    pthread_join(e->thr, NULL);
    if (e->reported == 1) {
        char body[96];
        json_t *r;
        snprintf(body, sizeof(body), "{\"ID\":\"%s\"}", e->lease);
        if (post(e->endpoint, "/v3/lease/revoke", body, &r) == 0)
            json_decref(r);
    }
    uv_close((uv_handle_t *)&e->async, on_async_closed);
}

int ty_store_elect_leader(const char *endpoint, const char *key, char *out, size_t cap)
{
    char k[1024], body[1100];
    if (!endpoint || !key || strlen(key) > 256)
        return TY_EINVAL;
    b64(key, k);
    snprintf(body, sizeof(body), "{\"key\":\"%s\"}", k);
    json_t *r;
    int rc = post(endpoint, "/v3/kv/range", body, &r);
    if (rc != 0)
        return rc;
    json_t *kvs = json_object_get(r, "kvs");
    const char *v = json_string_value(json_object_get(json_array_get(kvs, 0), "value"));
    rc = v ? unb64(v, out, cap) : TY_ENOTFOUND;
    json_decref(r);
    return rc;
}
