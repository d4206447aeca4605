/* The private line's stage of the packet loop (include/tj_line.h): VXLAN in a VPC's VNI <-> 802.1Q in its line's
 * VLAN. Every backend hands the loop the handoff's frames with their tag in the bytes (io_packet.c puts back what
 * the kernel moved into the ring's metadata), and the stage writes it into those it sends. */
#include <arpa/inet.h>
#include <string.h>

#include "tj_ip4.h"
#include "tj_loop.h"

#define TPID 0x8100
#define TAGGED 18  /* Ethernet with an 802.1Q tag */
#define LINE_MEMO 4096  /* flows lately handed to the XDP cache (a power of two) */
/* frames of a flow still reaching C this long after it was handed over: the cache's LRU aged it out (or the put
 * was lost), so it is handed over again; the frames queued for the loop before it was handed are far younger */
#define MEMO_FRESH_S 0.1

static void no_lock(dp_t *dp) { (void)dp; }

/* --- the XDP flow cache (include/tj_xdp.h). A line keeps no state per flow, so a flow is the cache's from the
 * first packet C carries (TCP or UDP, no options, not a fragment). Frames of it already on their way to the loop
 * would hand it over again: `memo` remembers the flows handed in the last MEMO_FRESH_S. Any change to what the
 * line's decisions are made from takes them all back at once (an epoch bump), and the cache's LRU maps age them
 * out. --- */
static void cache(dp_t *dp, double now, int in_port, uint32_t vtep, uint32_t kvni, const uint8_t *pkt,
                  const ip4_t *ip, int out_port, const uint8_t *o, uint32_t mtu, uint8_t flags, uint16_t vlan) {
    if (!dp->be->flow_put || !dp->line.memo || ip->ihl != 20 || ip->frag || (ip->proto != 6 && ip->proto != 17) ||
        ip->total < (ip->proto == 6 ? 40u : 28u)) return;
    struct tj_flow_key k;
    dp_flow_key(&k, vtep, kvni, ip->src, ip->dst, rd16(pkt + 20), rd16(pkt + 22), ip->proto);
    line_memo_t *m = &dp->line.memo[mix(((uint64_t)ip->src << 32 | ip->dst) ^ ((uint64_t)rd32(pkt + 20) << 16) ^
                                        ((uint64_t)kvni << 8) ^ vtep) & (LINE_MEMO - 1)];
    if (!memcmp(&m->k, &k, sizeof k) && now - m->at < MEMO_FRESH_S) return;
    struct tj_flow_act a;
    dp_flow_act(dp, &a, in_port, out_port, o, mtu, flags);
    a.tci = htons(vlan);
    if (dp->be->flow_put(dp, in_port, &k, &a, out_port) == 0) { m->k = k; m->at = now; }
}

/* under dp->cfg: what the cached flows were made from changed */
static void uncache(dp_t *dp, uint32_t vni) {
    (void)vni;  /* routes, neighbours and lines are per VLAN and VNI both ways: all go */
    if (dp->line.memo) memset(dp->line.memo, 0, sizeof *dp->line.memo * LINE_MEMO);
    if (dp->be && dp->be->flow_drop_all) dp->be->flow_drop_all(dp);
}

static uint32_t mask_of(uint32_t len) { return len ? 0xffffffffu << (32 - len) : 0; }
static uint64_t route_key(uint32_t vni, uint32_t len, uint32_t net) {
    return ((uint64_t)vni << 38 | (uint64_t)len << 32 | net) + 1;
}
static const tj_line_t *line_of(const dp_t *dp, uint32_t vlan) {
    uint64_t p;
    return map_get(dp->line.lines, vlan | 1ULL << 32, &p) ? (const tj_line_t *)(uintptr_t)p : NULL;
}
static const line_vni_t *vni_of(const dp_t *dp, uint32_t vni) {
    uint64_t p;
    return map_get(dp->line.vnis, vni | 1ULL << 32, &p) ? (const line_vni_t *)(uintptr_t)p : NULL;
}

/* the longest prefix of the VNI's routes that holds dst, or NULL */
static const tj_line_route_t *lookup(const dp_t *dp, uint32_t vni, uint32_t dst) {
    const line_vni_t *v = vni_of(dp, vni);
    if (!v) return NULL;
    for (uint64_t lens = v->lens; lens; ) {
        uint32_t len = 63 - (uint32_t)__builtin_clzll(lens);
        uint64_t p;
        if (map_get(dp->line.routes, route_key(vni, len, dst & mask_of(len)), &p))
            return (const tj_line_route_t *)(uintptr_t)p;
        lens &= ~(1ULL << len);
    }
    return NULL;
}

/* a VPC's packet (VXLAN) to the line its route names, tagged with the line's VLAN */
static int from_underlay(dp_t *dp, double now, uint8_t *d, uint32_t len, uint8_t **out, uint32_t *out_len) {
    uint32_t vni;
    int act = dp_vxlan_in(dp, d, len, &vni);
    if (act != 0) return act;
    uint8_t *inner = d + ENCAP + 14;
    uint32_t ilen = len - ENCAP - 14;
    ip4_t ip;
    if (!ip4_parse(inner, ilen, &ip)) { dp->c[C_drop_malformed]++; return ACT_DROP; }
    const tj_line_route_t *r = lookup(dp, vni, ip.dst);
    if (!r) { dp->c[C_drop_no_route]++; return ACT_DROP; }
    uint64_t mac;  /* too big for the handoff (fragments, or fragmentation needed), or its router unknown: Python */
    if (ip.total > dp->line.handoff_mtu ||
        !map_get(dp->line.neigh, ((uint64_t)r->vlan << 32 | r->nexthop) + 1, &mac)) return ACT_PUNT;
    uint8_t *e = inner - TAGGED;
    mac_out(e, mac); memcpy(e + 6, dp->mac[DP_EXT], 6);
    wr16(e + 12, TPID); wr16(e + 14, r->vlan); wr16(e + 16, 0x0800);
    *out = e; *out_len = ilen + TAGGED;
    dp->c[C_line_out]++;
    cache(dp, now, DP_UL, rd32(d + 26), vni, inner, &ip, DP_EXT, e, dp->line.handoff_mtu, TJ_XDP_PUSH_TAG, r->vlan);
    return DP_EXT;
}

/* a frame from the handoff: into its line's VPC, encapsulated to the endpoint's hypervisor */
static int from_handoff(dp_t *dp, double now, uint8_t *d, uint32_t len, uint8_t **out, uint32_t *out_len) {
    if (len < 14) { dp->c[C_drop_malformed]++; return ACT_DROP; }
    if (len < TAGGED || rd16(d + 12) != TPID) { dp->c[C_drop_untagged]++; return ACT_DROP; }
    uint32_t vlan = rd16(d + 14) & 0xfff;
    const tj_line_t *l = line_of(dp, vlan);
    if (!l) { dp->c[C_drop_unknown_vlan]++; return ACT_DROP; }
    uint16_t et = rd16(d + 16);
    if (et == 0x0806) return ACT_PUNT;  /* Python learns the router, the session's kernel answers */
    if (et != 0x0800 || len < TAGGED + 20) { dp->c[C_drop_not_ipv4]++; return ACT_DROP; }
    uint8_t *pkt = d + TAGGED;
    uint64_t v;
    if (map_get(dp->line.locals, ((uint64_t)vlan << 32 | rd32(pkt + 16)) + 1, &v)) return ACT_PUNT;  /* BGP, BFD */
    if (memcmp(d, dp->mac[DP_EXT], 6) != 0) { dp->c[C_ignored]++; return ACT_DROP; }
    ip4_t ip;
    if (!ip4_parse(pkt, len - TAGGED, &ip)) { dp->c[C_drop_malformed]++; return ACT_DROP; }
    if ((ip.dst & mask_of(l->vpc_len)) != l->vpc_net) { dp->c[C_drop_not_in_vpc]++; return ACT_DROP; }
    if (pkt[8] <= 1 || ip.total > l->mtu) return ACT_PUNT;  /* time exceeded, fragments, fragmentation needed */
    uint64_t nh, rmac;
    const tj_endpoint_t *ep = dp_endpoint(dp, l->vni, ip.dst);
    if (!ep || !map_get(dp->routers, l->vni | (1ULL << 32), &rmac) ||
        !map_get(dp->neigh[DP_UL], ep->vtep | (1ULL << 32), &nh)) return ACT_PUNT;
    ip4_dec_ttl(pkt);
    uint8_t *e = pkt - 14;  /* the inner Ethernet header over the tag and the handoff's addresses */
    dp_encap_to(dp, e - ENCAP, e, len - TAGGED + 14, ep->mac, rmac, nh, ep->vtep, l->vni);
    *out = e - ENCAP; *out_len = ENCAP + len - TAGGED + 14;
    dp->c[C_line_in]++;
    cache(dp, now, DP_EXT, 0, TJ_XDP_VLAN | vlan, pkt, &ip, DP_UL, *out, l->mtu, TJ_XDP_TTL, 0);
    return DP_UL;
}

static int decide(dp_t *dp, int port, uint8_t *d, uint32_t len, double now, uint8_t **out, uint32_t *out_len) {
    if (port == DP_EXT) return from_handoff(dp, now, d, len, out, out_len);
    int act = dp_ipv4_for_us(dp, port, d, len);
    return act != 0 ? act : from_underlay(dp, now, d, len, out, out_len);
}

const stage_t STAGE_LINE = {.lock = no_lock, .unlock = no_lock, .decide = decide, .uncache = uncache};

void dp_use_line(dp_t *dp, uint32_t handoff_mtu) {
    pthread_mutex_lock(&dp->cfg);
    dp->line.handoff_mtu = handoff_mtu; dp->stage = &STAGE_LINE;
    if (!dp->line.memo) dp->line.memo = calloc(LINE_MEMO, sizeof *dp->line.memo);  /* none: the loop carries all */
    uncache(dp, 0);
    pthread_mutex_unlock(&dp->cfg);
}

/* under dp->cfg: the line's session addresses out of `locals` */
static void unindex_line(dp_t *dp, const tj_line_t *l) {
    for (uint32_t i = 0; i < l->nlocals && i < TJ_LINE_SESSIONS; i++)
        map_del(dp->line.locals, ((uint64_t)l->vlan << 32 | l->locals[i]) + 1);
}

int dp_set_line(dp_t *dp, const tj_line_t *line) {
    tj_line_t *l = malloc(sizeof *l);
    if (!l) return -1;
    *l = *line;
    l->vlan &= 0xfff;
    if (l->nlocals > TJ_LINE_SESSIONS) l->nlocals = TJ_LINE_SESSIONS;
    pthread_mutex_lock(&dp->cfg);
    if (map_reserve(&dp->line.lines, 1) || map_reserve(&dp->line.locals, l->nlocals)) {
        pthread_mutex_unlock(&dp->cfg);
        free(l);
        return -1;
    }
    tj_line_t *old = (tj_line_t *)line_of(dp, l->vlan);
    if (old) unindex_line(dp, old);
    for (uint32_t i = 0; i < l->nlocals; i++) map_put(dp->line.locals, ((uint64_t)l->vlan << 32 | l->locals[i]) + 1, 1);
    map_put(dp->line.lines, l->vlan | 1ULL << 32, (uint64_t)(uintptr_t)l);
    uncache(dp, 0);
    pthread_mutex_unlock(&dp->cfg);
    free(old);
    return 0;
}

int dp_remove_line(dp_t *dp, uint16_t vlan) {
    pthread_mutex_lock(&dp->cfg);
    tj_line_t *old = (tj_line_t *)line_of(dp, vlan & 0xfff);
    if (old) {
        unindex_line(dp, old);
        map_del(dp->line.lines, (vlan & 0xfff) | 1ULL << 32);
        uncache(dp, 0);
    }
    pthread_mutex_unlock(&dp->cfg);
    free(old);
    return old ? 0 : -1;
}

int dp_set_line_routes(dp_t *dp, uint32_t vni, const tj_line_route_t *routes, uint32_t n) {
    line_vni_t *v = NULL;
    if (n) {
        v = calloc(1, sizeof *v);
        tj_line_route_t *copy = malloc(sizeof *copy * n);
        if (!v || !copy) { free(v); free(copy); return -1; }
        memcpy(copy, routes, sizeof *copy * n);
        v->n = n; v->r = copy;
        for (uint32_t i = 0; i < n; i++) {
            if (copy[i].len > 32) copy[i].len = 32;
            copy[i].net &= mask_of(copy[i].len);
            v->lens |= 1ULL << copy[i].len;
        }
    }
    pthread_mutex_lock(&dp->cfg);
    if (map_reserve(&dp->line.vnis, 1) || map_reserve(&dp->line.routes, n)) {
        pthread_mutex_unlock(&dp->cfg);
        if (v) { free(v->r); free(v); }
        return -1;
    }
    line_vni_t *old = (line_vni_t *)vni_of(dp, vni);
    for (uint32_t i = 0; old && i < old->n; i++) {
        uint64_t k = route_key(vni, old->r[i].len, old->r[i].net), p;
        if (map_get(dp->line.routes, k, &p) && p == (uint64_t)(uintptr_t)&old->r[i]) map_del(dp->line.routes, k);
    }
    if (v) {
        for (uint32_t i = 0; i < n; i++)  /* the first of two equal prefixes wins, as in the reference's table */
            if (!map_get(dp->line.routes, route_key(vni, v->r[i].len, v->r[i].net), &(uint64_t){0}))
                map_put(dp->line.routes, route_key(vni, v->r[i].len, v->r[i].net), (uint64_t)(uintptr_t)&v->r[i]);
        map_put(dp->line.vnis, vni | 1ULL << 32, (uint64_t)(uintptr_t)v);
    } else {
        map_del(dp->line.vnis, vni | 1ULL << 32);
    }
    uncache(dp, vni);
    pthread_mutex_unlock(&dp->cfg);
    if (old) { free(old->r); free(old); }
    return 0;
}

int dp_set_line_neigh(dp_t *dp, uint16_t vlan, uint32_t ip, const uint8_t *mac) {
    uint64_t key = ((uint64_t)(vlan & 0xfff) << 32 | ip) + 1, old;
    pthread_mutex_lock(&dp->cfg);
    int known = dp->line.neigh && map_get(dp->line.neigh, key, &old);
    int r = map_grow_put(&dp->line.neigh, key, mac64(mac));
    if (known && old != mac64(mac)) uncache(dp, 0);  /* a new router's MAC: its flows' Ethernet headers change */
    pthread_mutex_unlock(&dp->cfg);
    return r;
}
