/* Segment metadata in etcd through its v3 JSON gateway (POST /v3/kv/put, /v3/kv/range,
 * /v3/kv/deleterange with base64 keys and values; /v3/lease/grant, /v3/lease/keepalive,
 * /v3/lease/revoke for the lease the segment key is put under), over libcurl. One curl easy
 * handle per call, so the client is safe from any thread (the lease id is an atomic). The value is
 * a JSON object describing a segment:
 * {"name", "host", "port", "host_id", "unix", "regions": [{"addr", "len", "location", "shared",
 *  "cuda_ipc", "rkeys"}], "nics"}.
 */
#include "xfer-impl.h"

#include "tycho/errors.h"
#include "tycho/log.h"

#include <curl/curl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ty__xfer_etcd {
    char endpoint[256];
    uint32_t timeout_ms;
    _Atomic int64_t lease; /* 0: puts carry no lease */
};

/* ---- base64 (RFC 4648 §4) -------------------------------------------------------------------- */

static const char b64_chars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *ty__xfer_b64_encode(const uint8_t *in, size_t len)
{
    char *out = malloc(4 * ((len + 2) / 3) + 1), *o = out;
    if (!out)
        abort();
    for (size_t i = 0; i < len; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16;
        if (i + 1 < len)
            v |= (uint32_t)in[i + 1] << 8;
        if (i + 2 < len)
            v |= in[i + 2];
        *o++ = b64_chars[(v >> 18) & 63];
        *o++ = b64_chars[(v >> 12) & 63];
        *o++ = i + 1 < len ? b64_chars[(v >> 6) & 63] : '=';
        *o++ = i + 2 < len ? b64_chars[v & 63] : '=';
    }
    *o = '\0';
    return out;
}

static int b64_val(char c)
{
    const char *p = c ? strchr(b64_chars, c) : NULL;
    return p ? (int)(p - b64_chars) : -1;
}

int ty__xfer_b64_decode(const char *in, uint8_t **out, size_t *out_len)
{
    size_t n = strlen(in);
    if (n % 4)
        return TY_EPARSE;
    uint8_t *buf = malloc(n / 4 * 3 + 1);
    if (!buf)
        abort();
    size_t o = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        for (int k = 0; k < 4; k++) {
            v[k] = in[i + k] == '=' && i + 4 == n && k >= 2 ? -2 : b64_val(in[i + k]);
            if (v[k] == -1 || (k == 3 && v[2] == -2 && v[3] != -2))
                goto err;
        }
        uint32_t x = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 |
                     (uint32_t)(v[2] < 0 ? 0 : v[2]) << 6 | (uint32_t)(v[3] < 0 ? 0 : v[3]);
        buf[o++] = (uint8_t)(x >> 16);
        if (v[2] >= 0)
            buf[o++] = (uint8_t)(x >> 8);
        if (v[3] >= 0)
            buf[o++] = (uint8_t)x;
    }
    buf[o] = '\0';
    *out = buf;
    *out_len = o;
    return 0;
err:
    free(buf);
    return TY_EPARSE;
}

/* ---- metadata JSON -----------------------------------------------------------------------------
 */

static json_t *nics_to_json(const struct ty__xfer_hello *h)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < h->n_nics; i++) {
        const struct ty__xfer_nic_info *n = &h->nics[i];
        char gid[33];
        for (int k = 0; k < 16; k++)
            snprintf(gid + 2 * k, 3, "%02x", n->gid[k]);
        json_array_append_new(arr, json_pack("{s:s,s:i,s:i,s:i,s:i,s:i,s:s}", "name", n->name,
                                             "port", n->port, "link", n->link_layer, "mtu", n->mtu,
                                             "gid_index", n->gid_index, "lid", n->lid, "gid", gid));
    }
    return arr;
}

char *ty__xfer_meta_to_json(const struct ty__xfer_hello *h, const char *host, uint16_t port)
{
    json_t *regs = json_array();
    for (size_t i = 0; i < h->n_regions; i++) {
        const struct ty_xfer_region_info *r = &h->regions[i];
        json_t *rk = json_array();
        for (size_t k = 0; k < h->n_nics; k++)
            json_array_append_new(rk, json_integer(h->rkeys[i * h->n_nics + k]));
        json_array_append_new(regs, json_pack("{s:I,s:I,s:s,s:b,s:b,s:o}", "addr",
                                              (json_int_t)r->addr, "len", (json_int_t)r->len,
                                              "location", r->location, "shared", r->shared,
                                              "cuda_ipc", r->cuda_ipc, "rkeys", rk));
    }
    json_t *o = json_pack("{s:s,s:s,s:i,s:s,s:s,s:o,s:o}", "name", h->name, "host", host, "port",
                          (int)port, "host_id", h->host_id, "unix", h->unix_name, "regions", regs,
                          "nics", nics_to_json(h));
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!s)
        abort();
    return s;
}

static int copy_str(json_t *o, const char *key, char *dst, size_t cap)
{
    const char *s = json_string_value(json_object_get(o, key));
    if (!s || strlen(s) >= cap)
        return TY_EPARSE;
    strcpy(dst, s);
    return 0;
}

static int json_small(json_t *o, const char *key, int max, int *out)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > max)
        return TY_EPARSE;
    *out = (int)json_integer_value(v);
    return 0;
}

static int meta_nic(json_t *o, struct ty__xfer_nic_info *n)
{
    int port, link, mtu, gi, lid;
    char gid[33];
    if (copy_str(o, "name", n->name, sizeof(n->name)) || json_small(o, "port", 255, &port) ||
        json_small(o, "link", 2, &link) || json_small(o, "mtu", 5, &mtu) ||
        json_small(o, "gid_index", 255, &gi) || json_small(o, "lid", 65535, &lid) ||
        copy_str(o, "gid", gid, sizeof(gid)) || strlen(gid) != 32 || port == 0 || link == 0 ||
        mtu == 0)
        return TY_EPARSE;
    for (int k = 0; k < 16; k++) {
        unsigned v;
        if (sscanf(gid + 2 * k, "%2x", &v) != 1)
            return TY_EPARSE;
        n->gid[k] = (uint8_t)v;
    }
    n->port = (uint8_t)port;
    n->link_layer = (uint8_t)link;
    n->mtu = (uint8_t)mtu;
    n->gid_index = (uint8_t)gi;
    n->lid = (uint16_t)lid;
    return 0;
}

/* "nics" (absent: none) and each region's "rkeys" (one per NIC). Regions parsed already. */
static int meta_nics(json_t *o, struct ty__xfer_hello *h)
{
    json_t *arr = json_object_get(o, "nics");
    size_t n = json_array_size(arr);
    if (!arr || n == 0)
        return 0;
    if (n > TY__XFER_RDMA_MAX_NICS)
        return TY_EPARSE;
    for (size_t i = 0; i < n; i++)
        if (meta_nic(json_array_get(arr, i), &h->nics[i]))
            return TY_EPARSE;
    h->n_nics = n;
    h->rkeys = calloc(h->n_regions * n + 1, sizeof(*h->rkeys));
    if (!h->rkeys)
        abort();
    json_t *regs = json_object_get(o, "regions");
    for (size_t r = 0; r < h->n_regions; r++) {
        json_t *rk = json_object_get(json_array_get(regs, r), "rkeys");
        if (json_array_size(rk) != n)
            return TY_EPARSE;
        for (size_t k = 0; k < n; k++) {
            json_t *v = json_array_get(rk, k);
            if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                json_integer_value(v) > UINT32_MAX)
                return TY_EPARSE;
            h->rkeys[r * n + k] = (uint32_t)json_integer_value(v);
        }
    }
    return 0;
}

static int meta_regions(json_t *arr, struct ty__xfer_hello *h)
{
    size_t n = json_array_size(arr);
    if (!json_is_array(arr) || n > TY_XFER_REGIONS_MAX)
        return TY_EPARSE;
    h->regions = calloc(n ? n : 1, sizeof(*h->regions));
    if (!h->regions)
        abort();
    h->n_regions = n;
    for (size_t i = 0; i < n; i++) {
        json_t *r = json_array_get(arr, i);
        json_t *a = json_object_get(r, "addr"), *l = json_object_get(r, "len");
        if (!json_is_integer(a) || !json_is_integer(l) || json_integer_value(a) < 0 ||
            json_integer_value(l) <= 0 ||
            copy_str(r, "location", h->regions[i].location, sizeof(h->regions[i].location)))
            return TY_EPARSE;
        h->regions[i].addr = (uint64_t)json_integer_value(a);
        h->regions[i].len = (uint64_t)json_integer_value(l);
        h->regions[i].shared = json_is_true(json_object_get(r, "shared"));
        h->regions[i].cuda_ipc = json_is_true(json_object_get(r, "cuda_ipc"));
    }
    return 0;
}

int ty__xfer_meta_from_json(const char *json, struct ty__xfer_hello *h, char *host, size_t host_cap,
                            uint16_t *port)
{
    memset(h, 0, sizeof(*h));
    json_t *o = json_loads(json, 0, NULL);
    if (!json_is_object(o)) {
        json_decref(o);
        return TY_EPARSE;
    }
    json_t *p = json_object_get(o, "port");
    int rc = TY_EPARSE;
    if (copy_str(o, "name", h->name, sizeof(h->name)) || copy_str(o, "host", host, host_cap) ||
        copy_str(o, "host_id", h->host_id, sizeof(h->host_id)) ||
        copy_str(o, "unix", h->unix_name, sizeof(h->unix_name)) || !json_is_integer(p) ||
        json_integer_value(p) <= 0 || json_integer_value(p) > 65535)
        goto out;
    *port = (uint16_t)json_integer_value(p);
    rc = meta_regions(json_object_get(o, "regions"), h);
    if (rc == 0)
        rc = meta_nics(o, h);
out:
    if (rc)
        ty__xfer_hello_clear(h);
    json_decref(o);
    return rc;
}

/* ---- HTTP ----------------------------------------------------------------------------------- */

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;

static void curl_init_once(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

struct body {
    char *p;
    size_t n;
};

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *arg)
{
    struct body *b = arg;
    size_t add = size * nmemb;
    if (b->n + add > (16u << 20))
        return 0; /* a metadata answer is small; refuse a flood */
    char *p = realloc(b->p, b->n + add + 1);
    if (!p)
        abort();
    memcpy(p + b->n, ptr, add);
    b->p = p;
    b->n += add;
    b->p[b->n] = '\0';
    return add;
}

/* POST a JSON body to endpoint+path; *resp gets the parsed answer. */
static int etcd_post(struct ty__xfer_etcd *c, const char *path, json_t *req, json_t **resp)
{
    char url[512], *data = json_dumps(req, JSON_COMPACT);
    snprintf(url, sizeof(url), "%s%s", c->endpoint, path);
    struct body b = {0};
    CURL *h = curl_easy_init();
    if (!h || !data)
        abort();
    struct curl_slist *hdrs = curl_slist_append(NULL, "Content-Type: application/json");
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, data);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)c->timeout_ms);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    CURLcode cc = curl_easy_perform(h);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(hdrs);
    curl_easy_cleanup(h);
    free(data);
    int rc = 0;
    if (cc != CURLE_OK || status != 200) {
        TY_LOG_ERROR(TY_XFER_SUBSYS, "etcd %s: %s (HTTP %ld)", url,
                     cc != CURLE_OK ? curl_easy_strerror(cc) : "request failed", status);
        rc = cc == CURLE_OPERATION_TIMEDOUT ? TY_ETIMEDOUT : TY_ERPC;
    } else if (!(*resp = json_loads(b.p ? b.p : "", 0, NULL))) {
        rc = TY_EPARSE;
    }
    free(b.p);
    return rc;
}

int ty__xfer_etcd_new(struct ty__xfer_etcd **out, const char *endpoint, uint32_t timeout_ms)
{
    if (strlen(endpoint) >= sizeof((*out)->endpoint) ||
        (strncmp(endpoint, "http://", 7) && strncmp(endpoint, "https://", 8)))
        return TY_EINVAL;
    pthread_once(&curl_once, curl_init_once);
    struct ty__xfer_etcd *c = calloc(1, sizeof(*c));
    if (!c)
        abort();
    strcpy(c->endpoint, endpoint);
    size_t n = strlen(c->endpoint);
    if (n && c->endpoint[n - 1] == '/')
        c->endpoint[n - 1] = '\0';
    c->timeout_ms = timeout_ms;
    *out = c;
    return 0;
}

void ty__xfer_etcd_free(struct ty__xfer_etcd *c)
{
    free(c);
}

static json_t *key_obj(const char *key)
{
    char *k = ty__xfer_b64_encode((const uint8_t *)key, strlen(key));
    json_t *o = json_pack("{s:s}", "key", k);
    free(k);
    return o;
}

int ty__xfer_etcd_put(struct ty__xfer_etcd *c, const char *key, const char *value)
{
    json_t *req = key_obj(key), *resp = NULL;
    char *v = ty__xfer_b64_encode((const uint8_t *)value, strlen(value));
    json_object_set_new(req, "value", json_string(v));
    free(v);
    int64_t lease = atomic_load(&c->lease);
    if (lease) { /* int64 fields are decimal strings in the gateway's JSON */
        char id[32];
        snprintf(id, sizeof(id), "%lld", (long long)lease);
        json_object_set_new(req, "lease", json_string(id));
    }
    int rc = etcd_post(c, "/v3/kv/put", req, &resp);
    json_decref(req);
    json_decref(resp);
    return rc;
}

int ty__xfer_etcd_get(struct ty__xfer_etcd *c, const char *key, char **value)
{
    json_t *req = key_obj(key), *resp = NULL;
    int rc = etcd_post(c, "/v3/kv/range", req, &resp);
    json_decref(req);
    if (rc)
        return rc;
    json_t *kv = json_array_get(json_object_get(resp, "kvs"), 0);
    const char *v = json_string_value(json_object_get(kv, "value"));
    if (!kv) {
        rc = TY_ENOTFOUND;
    } else if (!v) {
        rc = TY_EPARSE;
    } else {
        uint8_t *raw;
        size_t n;
        rc = ty__xfer_b64_decode(v, &raw, &n);
        if (rc == 0)
            *value = (char *)raw;
    }
    json_decref(resp);
    return rc;
}

int ty__xfer_etcd_del(struct ty__xfer_etcd *c, const char *key)
{
    json_t *req = key_obj(key), *resp = NULL;
    int rc = etcd_post(c, "/v3/kv/deleterange", req, &resp);
    json_decref(req);
    json_decref(resp);
    return rc;
}

/* ---- leases --------------------------------------------------------------------------------- */

/* An int64 the gateway may send as a string or a number. */
static int64_t json_i64(json_t *v)
{
    if (json_is_integer(v))
        return (int64_t)json_integer_value(v);
    const char *s = json_string_value(v);
    return s ? strtoll(s, NULL, 10) : 0;
}

int ty__xfer_etcd_lease_grant(struct ty__xfer_etcd *c, uint32_t ttl_s)
{
    json_t *req = json_pack("{s:I}", "TTL", (json_int_t)ttl_s), *resp = NULL;
    int rc = etcd_post(c, "/v3/lease/grant", req, &resp);
    json_decref(req);
    if (rc)
        return rc;
    int64_t id = json_i64(json_object_get(resp, "ID"));
    json_decref(resp);
    if (id == 0) {
        TY_LOG_ERROR(TY_XFER_SUBSYS, "etcd lease grant: no lease id in the answer");
        return TY_EPARSE;
    }
    atomic_store(&c->lease, id);
    return 0;
}

int ty__xfer_etcd_lease_keepalive(struct ty__xfer_etcd *c)
{
    int64_t id = atomic_load(&c->lease);
    if (!id)
        return TY_ELEASE;
    char ids[32];
    snprintf(ids, sizeof(ids), "%lld", (long long)id);
    json_t *req = json_pack("{s:s}", "ID", ids), *resp = NULL;
    int rc = etcd_post(c, "/v3/lease/keepalive", req, &resp);
    json_decref(req);
    if (rc)
        return rc;
    /* one streamed message: {"result":{"ID":..,"TTL":..}}; TTL absent or 0: the lease is gone */
    json_t *res = json_object_get(resp, "result");
    int64_t ttl = json_i64(json_object_get(res ? res : resp, "TTL"));
    json_decref(resp);
    return ttl > 0 ? 0 : TY_ELEASE;
}

int ty__xfer_etcd_lease_revoke(struct ty__xfer_etcd *c)
{
    int64_t id = atomic_exchange(&c->lease, 0);
    if (!id)
        return 0;
    char ids[32];
    snprintf(ids, sizeof(ids), "%lld", (long long)id);
    json_t *req = json_pack("{s:s}", "ID", ids), *resp = NULL;
    int rc = etcd_post(c, "/v3/lease/revoke", req, &resp);
    json_decref(req);
    json_decref(resp);
    return rc;
}
