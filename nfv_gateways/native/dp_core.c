/* The packet loop and the API Python calls (include/tj_dp.h): bursts in, the stage decides, bursts out. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "tj_loop.h"

static const char *const counter_names[] = {
#define TJ_COUNTER_NAME(name) #name,
    TJ_DP_COUNTERS(TJ_COUNTER_NAME)
};

static double now_s(void) { struct timespec t; clock_gettime(CLOCK_REALTIME, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

void dp_vxlan_encap(dp_t *dp, uint8_t *o, uint64_t next_hop_mac, uint32_t vtep, uint32_t vni, uint32_t flow_hash,
                    uint32_t inner_len) {
    uint32_t total = ENCAP + inner_len;
    mac_out(o, next_hop_mac); memcpy(o + 6, dp->mac[DP_UL], 6); wr16(o + 12, 0x0800);
    uint8_t *h = o + 14;
    h[0] = 0x45; h[1] = 0; wr16(h + 2, (uint16_t)(total - 14)); wr16(h + 4, 0); wr16(h + 6, 0x4000);
    h[8] = 64; h[9] = 17; wr16(h + 10, 0); wr32(h + 12, dp->vtep_ip); wr32(h + 16, vtep);
    wr16(h + 10, csum(h, 20));
    uint8_t *u = h + 20;
    wr16(u, (uint16_t)(49152 | (flow_hash & 0x3fff)));
    wr16(u + 2, VXLAN_PORT); wr16(u + 4, (uint16_t)(total - 34)); wr16(u + 6, 0);
    uint8_t *x = u + 8;
    wr32(x, 0x08000000); wr32(x + 4, vni << 8);
}

int dp_ipv4_for_us(dp_t *dp, int port, const uint8_t *d, uint32_t len) {
    if (len < 14) { dp->c[C_drop_malformed]++; return ACT_DROP; }
    uint16_t et = rd16(d + 12);
    if (et == 0x0806) return ACT_PUNT;
    if (et != 0x0800 || memcmp(d, dp->mac[port], 6) != 0) { dp->c[C_ignored]++; return ACT_DROP; }
    return 0;
}

int dp_vxlan_in(dp_t *dp, const uint8_t *d, uint32_t len, uint32_t *vni) {
    const uint8_t *o = d + 14;
    if (len < 14 + 20 || o[0] != 0x45 || o[9] != 17 || rd32(o + 16) != dp->vtep_ip) return ACT_PUNT;
    if ((rd16(o + 6) & 0x3fff) || csum(o, 20) != 0) return ACT_PUNT;  /* fragments, bad sums: Python */
    if (len < 14 + 20 + 8 || rd16(o + 22) != VXLAN_PORT) return ACT_PUNT;
    uint64_t v;
    if (!map_get(dp->vteps, rd32(o + 12) | (1ULL << 32), &v)) { dp->c[C_drop_unknown_vtep]++; return ACT_DROP; }
    if (len < ENCAP + 14 + 20 || !(o[28] & 0x08)) { dp->c[C_drop_malformed]++; return ACT_DROP; }
    *vni = rd32(o + 32) >> 8;
    if (!map_get(dp->routers, *vni | (1ULL << 32), &v)) { dp->c[C_drop_unknown_vni]++; return ACT_DROP; }
    if (rd16(d + ENCAP + 12) != 0x0800) { dp->c[C_drop_not_ipv4]++; return ACT_DROP; }
    return 0;
}

void dp_encap_to(dp_t *dp, uint8_t *o, uint8_t *e, uint32_t elen, const uint8_t *mac, uint64_t rmac, uint64_t nh,
                 uint32_t vtep, uint32_t vni) {
    memcpy(e, mac, 6); mac_out(e + 6, rmac); wr16(e + 12, 0x0800);
    /* source port from the inner flow: ECMP entropy on the underlay, as Linux does */
    dp_vxlan_encap(dp, o, nh, vtep, vni, dp_flow_entropy(e + 14), elen);
}

static void transmit(dp_t *dp, int port, uint8_t **data, uint32_t *len, uint32_t n) {
    int sent = dp->be->tx(dp, port, data, len, n);
    uint32_t ok = sent > 0 ? (uint32_t)sent : 0;
    dp->c[port == DP_UL ? C_tx_ul : C_tx_ext] += ok;
    if (ok < n) dp->c[C_tx_err] += n - ok;
}

/* frames Python asked us to send (slow-path answers, ARP) */
static int drain_inject(dp_t *dp) {
    ring_t *r = &dp->inject;
    if (r->tail == r->head) return 0;
    int total = 0;
    pthread_mutex_lock(&r->mu);
    while (r->head != r->tail) {
        slot_t *s = &r->slots[r->head % RING];
        uint8_t *d = s->data; uint32_t l = s->len;
        transmit(dp, s->port, &d, &l, 1);
        r->head++;
        total++;
    }
    pthread_mutex_unlock(&r->mu);
    return total;
}

/* One pass over both ports: receive a burst, decide each frame, transmit per output port. */
int dp_poll_once(dp_t *dp) {
    uint8_t *rx[DP_BURST], *txd[2][DP_BURST];
    uint32_t rxl[DP_BURST], txl[2][DP_BURST];
    int total = 0;
    for (int port = 0; port < 2; port++) {
        int n = dp->be->rx(dp, port, rx, rxl, DP_BURST);
        if (n <= 0) continue;
        total += n;
        dp->c[port == DP_UL ? C_rx_ul : C_rx_ext] += (uint64_t)n;
        dp->c[C_bursts]++;
        uint32_t nt[2] = {0, 0};
        double now = now_s();
        pthread_mutex_lock(&dp->cfg);
        dp->stage->lock(dp);
        for (int i = 0; i < n; i++) {
            uint8_t *o; uint32_t ol;
            int act = dp->stage->decide(dp, port, rx[i], rxl[i], now, &o, &ol);
            if (act >= 0) { txd[act][nt[act]] = o; txl[act][nt[act]++] = ol; }
            else if (act == ACT_PUNT)
                ring_push(&dp->punt, (uint8_t)port, rx[i], rxl[i]) ? dp->c[C_punt_full]++ : dp->c[C_punt]++;
        }
        dp->stage->unlock(dp);
        pthread_mutex_unlock(&dp->cfg);
        for (int p = 0; p < 2; p++) if (nt[p]) transmit(dp, p, txd[p], txl[p], nt[p]);
        dp->be->rx_done(dp, port, (uint32_t)n);
    }
    return total + drain_inject(dp);
}

/* Sleep until a port has frames, Python injects, or 100 ms pass. The eventfd is drained here, where the loop
 * sleeps: a wake-up written after the ring was already emptied would otherwise keep poll() returning at once. */
void dp_wait(dp_t *dp, int fd0, int fd1) {
    struct pollfd p[3] = {{fd0, POLLIN, 0}, {fd1, POLLIN, 0}, {dp->evfd, POLLIN, 0}};
    uint64_t drain;
    if (poll(p, 3, 100) > 0 && (p[2].revents & POLLIN) && read(dp->evfd, &drain, 8) < 0) { /* raced: fine */ }
}

void *dp_loop(void *arg) {
    dp_t *dp = arg;
    struct timespec t0, t1;
    while (dp->running) {
        clock_gettime(CLOCK_MONOTONIC, &t0);
        if (dp_poll_once(dp) == 0) { dp->nidle++; dp->be->idle(dp); continue; }
        dp->nidle = 0;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        dp->c[C_busy_ns] += (uint64_t)((t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec));
    }
    return NULL;
}

/* until a role gives the loop its stage, Python sees every frame */
static void no_lock(dp_t *dp) { (void)dp; }
static int punt_all(dp_t *dp, int port, uint8_t *d, uint32_t len, double now, uint8_t **out, uint32_t *out_len) {
    (void)dp; (void)port; (void)d; (void)len; (void)now; (void)out; (void)out_len;
    return ACT_PUNT;
}
static const stage_t STAGE_PUNT = {.lock = no_lock, .unlock = no_lock, .decide = punt_all};

/* --- the API Python calls ----------------------------------------------------------------------------------- */
dp_t *dp_create(const uint8_t *ul_mac, const uint8_t *ext_mac, uint32_t vtep_ip) {
    dp_t *dp = calloc(1, sizeof(dp_t));
    if (!dp) return NULL;
    dp->stage = &STAGE_PUNT;
    dp->cache_after = 8;  /* a request and its answer never reach the XDP cache: its two map writes cost more */
    memcpy(dp->mac[DP_UL], ul_mac, 6); memcpy(dp->mac[DP_EXT], ext_mac, 6); dp->vtep_ip = vtep_ip;
    pthread_mutex_init(&dp->cfg, NULL);
    dp->evfd = -1;
    if (ring_init(&dp->punt) || ring_init(&dp->inject) || (dp->evfd = eventfd(0, EFD_NONBLOCK)) < 0) {
        ring_free(&dp->punt); ring_free(&dp->inject); free(dp);
        return NULL;
    }
    return dp;
}

const char *dp_error(dp_t *dp) { return dp->err; }

int dp_open(dp_t *dp, const char *backend, const char *ul, const char *ext, const char *arg) {
    (void)arg;
    if (!strcmp(backend, "packet")) return io_packet_open(dp, ul, ext);
    if (!strcmp(backend, "mem")) return io_mem_open(dp);
#ifdef TJ_XDP
    if (!strcmp(backend, "xdp")) return io_xdp_open(dp, ul, ext, arg);
#endif
#ifdef TJ_DPDK
    if (!strcmp(backend, "dpdk")) return io_dpdk_open(dp, arg);
#endif
    snprintf(dp->err, sizeof dp->err, "backend %s is not built into this library", backend);
    return -1;
}

int dp_start(dp_t *dp, int cpu) {
    dp->running = 1;
    if (dp->be->start) return dp->be->start(dp);
    int r = pthread_create(&dp->thread, NULL, dp_loop, dp);
    if (r == 0 && cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpu, &set);
        pthread_setaffinity_np(dp->thread, sizeof set, &set);  /* refused (a cpuset): it runs anywhere, still right */
    }
    return r;
}

void dp_stop(dp_t *dp) {
    if (!dp->running) return;
    dp->running = 0;
    uint64_t one = 1;
    if (write(dp->evfd, &one, 8) < 0) { /* the loop also wakes on its poll timeout */ }
    if (dp->be->join) dp->be->join(dp);
    else pthread_join(dp->thread, NULL);
}

void dp_close(dp_t *dp) {
    dp_stop(dp);
    pthread_mutex_lock(&dp->cfg);  /* a stage's calls from Python (dp_svc_del...) reach the backend's flow cache */
    if (dp->be) dp->be->close(dp);
    dp->be = NULL;
    pthread_mutex_unlock(&dp->cfg);
}

int dp_punt(dp_t *dp, uint8_t *bufs, uint32_t *lens, uint8_t *ports, uint32_t max, int timeout_ms) {
    ring_t *r = &dp->punt;
    pthread_mutex_lock(&r->mu);
    if (r->head == r->tail && timeout_ms > 0) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        t.tv_nsec += (long)timeout_ms * 1000000L;
        t.tv_sec += t.tv_nsec / 1000000000L; t.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&r->cv, &r->mu, &t);
    }
    int n = ring_take(r, bufs, lens, ports, max);
    pthread_mutex_unlock(&r->mu);
    return n;
}

int dp_inject(dp_t *dp, uint8_t port, const uint8_t *data, uint32_t len) {
    if (port > 1 || len > DP_SLOT) return -1;
    if (ring_push(&dp->inject, port, data, len)) { dp->c[C_inject_full]++; return -1; }
    dp->c[C_inject]++;
    uint64_t one = 1;
    if (write(dp->evfd, &one, 8) < 0) { /* counter saturated: the loop is awake anyway */ }
    return 0;
}

/* under dp->cfg: config the XDP cache's flows were made from changed */
static void uncache(dp_t *dp, uint32_t vni) { if (dp->stage->uncache) dp->stage->uncache(dp, vni); }

int dp_set_vteps(dp_t *dp, const uint32_t *vteps, uint32_t n) {
    map_t *v = map_new(n);
    for (uint32_t i = 0; v && i < n; i++) map_put(v, vteps[i] | (1ULL << 32), 1);
    if (!v) return -1;
    pthread_mutex_lock(&dp->cfg);
    map_t *old = dp->vteps;
    dp->vteps = v;
    uncache(dp, 0);
    pthread_mutex_unlock(&dp->cfg);
    map_free(old);
    return 0;
}

static vpc_fwd_t *vpc_fwd(const dp_t *dp, uint32_t vni) {
    uint64_t p;
    return map_get(dp->vpcs, vni | 1ULL << 32, &p) ? (vpc_fwd_t *)(uintptr_t)p : NULL;
}

/* under dp->cfg: the VPC's endpoints out of `endpoints` (its record is the caller's to free) */
static void unindex_vpc(dp_t *dp, uint32_t vni, const vpc_fwd_t *f) {
    for (uint32_t i = 0; i < f->n; i++) {
        uint64_t k = ((uint64_t)vni << 32 | f->eps[i].ip) + 1, p;
        if (map_get(dp->endpoints, k, &p) && p == (uint64_t)(uintptr_t)&f->eps[i]) map_del(dp->endpoints, k);
    }
}

int dp_set_vpc(dp_t *dp, uint32_t vni, const uint8_t *router_mac, const tj_endpoint_t *eps, uint32_t n) {
    vpc_fwd_t *f = calloc(1, sizeof *f);
    tj_endpoint_t *copy = malloc(sizeof(tj_endpoint_t) * (n ? n : 1));
    if (!f || !copy) { free(f); free(copy); return -1; }
    memcpy(copy, eps, sizeof(tj_endpoint_t) * n);
    f->n = n; f->eps = copy;
    pthread_mutex_lock(&dp->cfg);
    vpc_fwd_t *old = vpc_fwd(dp, vni);
    if (map_reserve(&dp->vpcs, 1) || map_reserve(&dp->routers, 1) || map_reserve(&dp->endpoints, n)) {
        pthread_mutex_unlock(&dp->cfg);
        free(f); free(copy);
        return -1;
    }
    if (old) unindex_vpc(dp, vni, old);
    for (uint32_t i = 0; i < n; i++)
        map_put(dp->endpoints, ((uint64_t)vni << 32 | copy[i].ip) + 1, (uint64_t)(uintptr_t)&copy[i]);
    map_put(dp->routers, vni | (1ULL << 32), mac64(router_mac));
    map_put(dp->vpcs, vni | 1ULL << 32, (uint64_t)(uintptr_t)f);
    uncache(dp, vni);
    pthread_mutex_unlock(&dp->cfg);
    if (old) { free(old->eps); free(old); }
    return 0;
}

int dp_remove_vpc(dp_t *dp, uint32_t vni) {
    pthread_mutex_lock(&dp->cfg);
    vpc_fwd_t *old = vpc_fwd(dp, vni);
    if (old) {
        unindex_vpc(dp, vni, old);
        map_del(dp->vpcs, vni | 1ULL << 32);
        map_del(dp->routers, vni | 1ULL << 32);
        uncache(dp, vni);
    }
    pthread_mutex_unlock(&dp->cfg);
    if (!old) return -1;
    free(old->eps); free(old);
    return 0;
}

int dp_get_endpoint(dp_t *dp, uint32_t vni, uint32_t ip, tj_endpoint_t *out) {
    pthread_mutex_lock(&dp->cfg);
    const tj_endpoint_t *e = dp_endpoint(dp, vni, ip);
    if (e) *out = *e;
    pthread_mutex_unlock(&dp->cfg);
    return e != NULL;
}

uint32_t dp_vpc_count(dp_t *dp) {
    pthread_mutex_lock(&dp->cfg);
    uint32_t n = dp->vpcs ? dp->vpcs->n : 0;
    pthread_mutex_unlock(&dp->cfg);
    return n;
}
uint32_t dp_endpoint_count(dp_t *dp) {
    pthread_mutex_lock(&dp->cfg);
    uint32_t n = dp->endpoints ? dp->endpoints->n : 0;
    pthread_mutex_unlock(&dp->cfg);
    return n;
}

int dp_set_neigh(dp_t *dp, uint8_t port, uint32_t ip, const uint8_t *mac) {
    if (port > 1) return -1;
    pthread_mutex_lock(&dp->cfg);
    if (!dp->neigh[port]) dp->neigh[port] = map_new(1024);
    uint64_t old = 0;
    if (dp->neigh[port] && map_get(dp->neigh[port], ip | (1ULL << 32), &old) && old != mac64(mac)) uncache(dp, 0);
    int r = dp->neigh[port] ? map_put(dp->neigh[port], ip | (1ULL << 32), mac64(mac)) : -1;
    pthread_mutex_unlock(&dp->cfg);
    return r;
}

void dp_set_ext_route(dp_t *dp, uint32_t net, uint32_t len, uint32_t gw) {
    pthread_mutex_lock(&dp->cfg);
    dp->ext_mask = len ? 0xffffffffu << (32 - (len > 32 ? 32 : len)) : 0;
    dp->ext_net = net & dp->ext_mask; dp->ext_gw = gw;
    uncache(dp, 0);
    pthread_mutex_unlock(&dp->cfg);
}

void dp_stats(dp_t *dp, uint64_t *out) {
    memcpy(out, dp->c, sizeof dp->c);
    if (dp->be && dp->be->flow_carried) out[C_xdp_carried] = dp->be->flow_carried(dp);
}
uint32_t dp_nstats(void) { return C_COUNT; }
const char *dp_counter_name(uint32_t i) { return i < C_COUNT ? counter_names[i] : NULL; }

int dp_poll(dp_t *dp) { return dp_poll_once(dp); }
void dp_set_cache_after(dp_t *dp, uint32_t n) { dp->cache_after = n; }

void dp_flow_key(struct tj_flow_key *k, uint32_t vtep, uint32_t vni, uint32_t src, uint32_t dst, uint16_t sport,
                 uint16_t dport, uint8_t proto) {
    memset(k, 0, sizeof *k);
    k->vtep = htonl(vtep); k->vni = vni; k->src = htonl(src); k->dst = htonl(dst);
    k->sport = htons(sport); k->dport = htons(dport); k->proto = proto;
}

void dp_flow_act(const dp_t *dp, struct tj_flow_act *a, int in_port, int out_port, const uint8_t *o, uint32_t mtu,
                 uint8_t flags) {
    memset(a, 0, sizeof *a);
    a->flags = flags; a->encap = out_port == DP_UL; a->mtu = mtu; a->expect_vtep = htonl(dp->vtep_ip);
    memcpy(a->expect_mac, dp->mac[in_port], 6);
    if (a->encap) memcpy(a->outer, o, ENCAP);
    memcpy(a->eth, o + (a->encap ? ENCAP : 0), 12);
}
void dp_set_cache_lru(dp_t *dp, uint32_t entries) { dp->cache_lru = entries; }
#ifndef TJ_XDP
int dp_xdp_test(const char *obj, uint8_t port, const void *key, const void *act, const uint8_t *in, uint32_t len,
                uint8_t *out, uint32_t *out_len) {
    (void)obj; (void)port; (void)key; (void)act; (void)in; (void)len; (void)out; (void)out_len;
    return -1;  /* a library built without XDP */
}
#endif
