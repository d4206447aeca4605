/* Memory backend: frames pushed and pulled by the caller, one poll at a time (tests: no interfaces, no threads,
 * deterministic). In every library. */
#include <stdlib.h>
#include <string.h>

#include "tj_loop.h"

#define MEM_FLOWS 64

typedef struct {
    uint8_t buf[2][DP_BURST][HEADROOM + DP_SLOT];
    uint32_t len[2][DP_BURST], n[2];
    ring_t out;
    /* the flows a stage handed the XDP cache (tests read them, and run the program on them: dp_xdp_test) */
    struct { uint8_t port; struct tj_flow_key k; struct tj_flow_act a; } flows[MEM_FLOWS];
    uint32_t nflows;
} mem_t;

static int mem_rx(dp_t *dp, int port, uint8_t **data, uint32_t *len, uint32_t max) {
    mem_t *s = dp->bs;
    uint32_t n = s->n[port] < max ? s->n[port] : max;
    for (uint32_t i = 0; i < n; i++) { data[i] = s->buf[port][i] + HEADROOM; len[i] = s->len[port][i]; }
    return (int)n;
}
static int mem_tx(dp_t *dp, int port, uint8_t **data, const uint32_t *len, uint32_t n) {
    mem_t *s = dp->bs;
    uint32_t i = 0;
    for (; i < n; i++) if (ring_push(&s->out, (uint8_t)port, data[i], len[i])) break;
    return (int)i;
}
static void mem_rx_done(dp_t *dp, int port, uint32_t n) { ((mem_t *)dp->bs)->n[port] -= n; }
static void mem_idle(dp_t *dp) { (void)dp; }
static void mem_close(dp_t *dp) { ring_free(&((mem_t *)dp->bs)->out); free(dp->bs); }

static int mem_flow_find(const mem_t *s, int port, const struct tj_flow_key *k) {
    for (uint32_t i = 0; i < s->nflows; i++)
        if (s->flows[i].port == port && !memcmp(&s->flows[i].k, k, sizeof *k)) return (int)i;
    return -1;
}
static int mem_flow_put(dp_t *dp, int port, const struct tj_flow_key *k, struct tj_flow_act *a, int out_port) {
    mem_t *s = dp->bs;
    int i = mem_flow_find(s, port, k);
    if (i < 0 && s->nflows == MEM_FLOWS) return -1;
    if (i < 0) i = (int)s->nflows++;
    a->tx = out_port == port;
    a->ifindex = (uint32_t)out_port + 1;  /* no interfaces: the port, one up */
    s->flows[i].port = (uint8_t)port; s->flows[i].k = *k; s->flows[i].a = *a;
    return 0;
}
static int mem_flow_take(dp_t *dp, int port, const struct tj_flow_key *k, int remove, uint64_t *last_ns) {
    mem_t *s = dp->bs;
    int i = mem_flow_find(s, port, k);
    if (i < 0) return -1;
    *last_ns = s->flows[i].a.last_ns;
    if (remove) s->flows[i] = s->flows[--s->nflows];
    return 0;
}
static void mem_flow_drop_all(dp_t *dp) { ((mem_t *)dp->bs)->nflows = 0; }
static const backend_t MEM = {.rx = mem_rx, .tx = mem_tx, .rx_done = mem_rx_done, .idle = mem_idle, .close = mem_close,
                              .flow_put = mem_flow_put, .flow_take = mem_flow_take,
                              .flow_drop_all = mem_flow_drop_all};

int io_mem_open(dp_t *dp) {
    mem_t *s = calloc(1, sizeof(mem_t));
    if (!s) return -1;
    if (ring_init(&s->out)) { free(s); return -1; }
    dp->bs = s; dp->be = &MEM;
    return 0;
}

int dp_mem_push(dp_t *dp, uint8_t port, const uint8_t *data, uint32_t len) {
    mem_t *s = dp->bs;
    if (dp->be != &MEM || port > 1 || len > DP_SLOT || s->n[port] >= DP_BURST) return -1;
    memcpy(s->buf[port][s->n[port]] + HEADROOM, data, len);
    s->len[port][s->n[port]++] = len;
    return 0;
}

/* what the loop transmitted, oldest first (the layout of dp_punt) */
int dp_mem_pop(dp_t *dp, uint8_t *bufs, uint32_t *lens, uint8_t *ports, uint32_t max) {
    if (dp->be != &MEM) return -1;
    ring_t *r = &((mem_t *)dp->bs)->out;
    pthread_mutex_lock(&r->mu);
    int n = ring_take(r, bufs, lens, ports, max);
    pthread_mutex_unlock(&r->mu);
    return n;
}

int dp_mem_flow_forget(dp_t *dp, uint32_t i) {
    mem_t *s = dp->bs;
    if (dp->be != &MEM || i >= s->nflows) return -1;
    s->flows[i] = s->flows[--s->nflows];
    return 0;
}

int dp_mem_flow(dp_t *dp, uint32_t i, uint8_t *port, void *key, void *act) {
    mem_t *s = dp->bs;
    if (dp->be != &MEM || i >= s->nflows) return -1;
    *port = s->flows[i].port;
    memcpy(key, &s->flows[i].k, sizeof s->flows[i].k);
    memcpy(act, &s->flows[i].a, sizeof s->flows[i].a);
    return 0;
}
