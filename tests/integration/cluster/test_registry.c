/* The Conductor's node registry against a real tycho-conductor, spoken to over its RPC port
 * as nodes do: refused registrations leave no trace, and the slots of dead nodes serve new
 * node ids once the table is full (a node without a configured name gets a new id at every
 * restart, so a long-running Conductor sees hundreds of them). */
#include "tycho/auth.h"
#include "tycho/errors.h"
#include "tycho/rpc.h"
#include "tycho.pb-c.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/socket.h>
#include <spawn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

extern char **environ;

static pid_t g_conductor = -1;
static uv_loop_t g_loop;
static ty_rpc_client_t *g_rpc;
static int g_http_port;
static char g_dir[] = "/tmp/tycho-registry-XXXXXX";

struct reply {
    bool done, accepted;
    char reason[256];
};

static void on_reply(const struct ty_rpc_result *res, void *arg)
{
    struct reply *r = arg;
    r->done = true;
    if (res->event != TY_RPC_EVENT_REPLY) {
        snprintf(r->reason, sizeof(r->reason), "RPC: %s", ty_strerror(res->status));
        return;
    }
    Tycho__V1__RegisterNodeReply *m =
        tycho__v1__register_node_reply__unpack(NULL, res->len, res->payload);
    if (m) {
        r->accepted = m->accepted;
        snprintf(r->reason, sizeof(r->reason), "%s", m->reason ? m->reason : "");
        tycho__v1__register_node_reply__free_unpacked(m, NULL);
    }
}

/* RegisterNode for `id` at an address where nothing listens (the node never heartbeats);
 * kv_dtype NULL: no model fingerprint (an f32 node). */
static struct reply register_kv(const char *id, int role, uint32_t block_tokens,
                                const char *kv_dtype)
{
    Tycho__V1__ModelFingerprint fp = TYCHO__V1__MODEL_FINGERPRINT__INIT;
    fp.dtype = (char *)kv_dtype;
    Tycho__V1__Capacity cap = TYCHO__V1__CAPACITY__INIT;
    cap.kv_pages = 64;
    cap.block_tokens = block_tokens;
    cap.max_batch = 8;
    Tycho__V1__RegisterNode m = TYCHO__V1__REGISTER_NODE__INIT;
    m.protocol_version = TYCHO__V1__PROTOCOL_VERSION__PROTOCOL_VERSION_CURRENT;
    m.role = (Tycho__V1__NodeRole)role;
    m.node_id = (char *)id;
    m.address = "127.0.0.1:1";
    m.transfer_segment = "127.0.0.1:2";
    m.capacity = &cap;
    static uint8_t instance[16] = "test_registry 01"; /* one process: it may register again */
    m.instance.data = instance;
    m.instance.len = sizeof(instance);
    if (kv_dtype)
        m.model = &fp;
    struct reply r = {0};
    struct ty_rpc_call_opts co = {.timeout_ms = 5000};
    assert_int_equal(ty_rpc_client_call_msg(g_rpc, TYCHO__V1__METHOD__METHOD_REGISTER_NODE,
                                            (const ProtobufCMessage *)&m, &co, on_reply, &r,
                                            NULL),
                     0);
    while (!r.done)
        uv_run(&g_loop, UV_RUN_ONCE);
    return r;
}

static struct reply register_node(const char *id, int role, uint32_t block_tokens)
{
    return register_kv(id, role, block_tokens, NULL);
}

static int read_rpc_port(const char *path)
{
    for (int i = 0; i < 400; i++) {
        FILE *f = fopen(path, "r");
        unsigned http, rpc;
        if (f) {
            int n = fscanf(f, "%u %u", &http, &rpc);
            fclose(f);
            if (n == 2) {
                g_http_port = (int)http;
                return (int)rpc;
            }
        }
        struct timespec ts = {0, 50 * 1000000};
        nanosleep(&ts, NULL);
    }
    return -1;
}

/* GET /metrics from the Conductor's HTTP port (malloc'ed text, headers included). */
static char *fetch_metrics(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_http_port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    const char *req = "GET /metrics HTTP/1.0\r\n\r\n";
    assert_int_equal(write(fd, req, strlen(req)), (ssize_t)strlen(req));
    size_t cap = 1 << 20, len = 0;
    char *buf = malloc(cap + 1);
    ssize_t n;
    while ((n = read(fd, buf + len, cap - len)) > 0)
        len += (size_t)n;
    close(fd);
    buf[len] = 0;
    return buf;
}

static int count_of(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

static int setup(void **state)
{
    (void)state;
    const char *data = getenv("TYCHO_TEST_DATA"), *build = getenv("TYCHO_BUILD_DIR");
    char model[1024], bin[1024], ports[256], model_arg[1100], port_arg[300];
    snprintf(model, sizeof(model), "%s/models/stories260K/stories260K.gguf", data ? data : "");
    if (!data || !build || access(model, R_OK) != 0) {
        printf("skip: no %s\n", model);
        exit(77);
    }
    if (!mkdtemp(g_dir))
        return -1;
    snprintf(bin, sizeof(bin), "%s/src/conductor/tycho-conductor", build);
    snprintf(ports, sizeof(ports), "%s/conductor.ports", g_dir);
    snprintf(model_arg, sizeof(model_arg), "--model_path=%s", model);
    snprintf(port_arg, sizeof(port_arg), "--port_file=%s", ports);
    char *argv[] = {bin, model_arg, port_arg, "--listen_port=0", "--rpc_port=0",
                    "--heartbeat_timeout=2s", "--log_level=warn", NULL};
    if (posix_spawn(&g_conductor, bin, NULL, NULL, argv, environ) != 0)
        return -1;
    int port = read_rpc_port(ports);
    if (port < 0)
        return -1;
    uv_loop_init(&g_loop);
    struct ty_rpc_client_opts o = {.loop = &g_loop, .host = "127.0.0.1", .port = (uint16_t)port,
                                   .auth = ty_auth_from_env()};
    return ty_rpc_client_new(&g_rpc, &o);
}

static void on_closed(void *arg)
{
    *(bool *)arg = true;
}

static int teardown(void **state)
{
    (void)state;
    if (g_rpc) {
        bool closed = false;
        ty_rpc_client_close(g_rpc, on_closed, &closed);
        while (!closed)
            uv_run(&g_loop, UV_RUN_ONCE);
        uv_loop_close(&g_loop);
    }
    if (g_conductor > 0) {
        kill(g_conductor, SIGTERM);
        waitpid(g_conductor, NULL, 0);
    }
    char ports[256];
    snprintf(ports, sizeof(ports), "%s/conductor.ports", g_dir);
    unlink(ports);
    rmdir(g_dir);
    return 0;
}

enum { PREFILL = TYCHO__V1__NODE_ROLE__NODE_ROLE_PREFILL,
       DECODE = TYCHO__V1__NODE_ROLE__NODE_ROLE_DECODE };

static void test_refused_and_reused(void **state)
{
    (void)state;
    char id[64];
    struct reply r = register_node("pf", PREFILL, 16);
    assert_true(r.accepted);
    /* refused (another block size than pf's): as often as the table has slots, and more */
    for (int i = 0; i < 300; i++) {
        snprintf(id, sizeof(id), "bad-%d", i);
        r = register_node(id, PREFILL, 32);
        if (r.accepted || !strstr(r.reason, "kv_block_tokens"))
            fail_msg("registration %d: accepted %d, reason '%s' (want a kv_block_tokens "
                     "refusal, not a full table)", i, r.accepted, r.reason);
    }
    /* another KV element type than pf's (f32), or one no node has: refused, no slot taken */
    for (int i = 0; i < 300; i++) {
        snprintf(id, sizeof(id), "half-%d", i);
        const char *dt = i % 3 ? (i % 2 ? "f16" : "bf16") : "f8";
        r = register_kv(id, i % 2 ? DECODE : PREFILL, 16, dt);
        char want[64];
        snprintf(want, sizeof(want),
                 i % 3 ? "kv_cache_dtype %s differs" : "must be f32, f16 or bf16", dt);
        if (r.accepted || !strstr(r.reason, want))
            fail_msg("registration %d: accepted %d, reason '%s' (want '%s')", i, r.accepted,
                     r.reason, want);
    }
    r = register_kv("pf-again", PREFILL, 16, "f32"); /* the same type, said explicitly */
    assert_true(r.accepted);
    /* fill the table: pf, pf-again and 253 others */
    for (int i = 0; i < 253; i++) {
        snprintf(id, sizeof(id), "ghost-%d", i);
        r = register_node(id, DECODE, 16);
        if (!r.accepted)
            fail_msg("ghost %d refused: %s", i, r.reason);
    }
    r = register_node("one-too-many", DECODE, 16);
    assert_false(r.accepted);
    assert_non_null(strstr(r.reason, "too many nodes"));
    /* none of them heartbeats: after the 2 s timeout all are dead, and new ids take their
     * slots */
    struct timespec ts = {3, 0};
    nanosleep(&ts, NULL);
    for (int i = 0; i < 50; i++) {
        snprintf(id, sizeof(id), "new-%d", i);
        r = register_node(id, DECODE, 16);
        if (!r.accepted)
            fail_msg("new node %d refused: %s", i, r.reason);
    }
    /* and an id seen before still finds its own entry */
    r = register_node("ghost-7", DECODE, 16);
    assert_true(r.accepted);
    /* the nodes whose slots were taken left /metrics: one tycho_node_up series per slot */
    char *m = fetch_metrics();
    if (count_of(m, "tycho_node_up{node=") != 255)
        fail_msg("%d tycho_node_up series, want 255 (one per slot)",
                 count_of(m, "tycho_node_up{node="));
    assert_int_equal(count_of(m, "tycho_node_up{node=\"pf\""), 0);       /* slot reused */
    assert_int_equal(count_of(m, "tycho_node_up{node=\"new-49\""), 1);
    assert_int_equal(count_of(m, "tycho_node_up{node=\"ghost-200\",role=\"decode\"} 0"), 1);
    free(m);
    /* a node id registered again with the other role keeps one series, with the new role */
    r = register_node("ghost-7", PREFILL, 16);
    assert_true(r.accepted);
    m = fetch_metrics();
    assert_int_equal(count_of(m, "tycho_node_up{node=\"ghost-7\""), 1);
    assert_int_equal(count_of(m, "tycho_node_up{node=\"ghost-7\",role=\"prefill\"} 1"), 1);
    free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_refused_and_reused)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
