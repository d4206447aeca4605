/* The load balancer's stage of the packet loop: a client's packet to VIP:port, in VXLAN from a vSwitch, goes on
 * unchanged to the member the connection table (lb_stage.c: the connection's member, or the pool's Maglev entry)
 * picks, re-encapsulated to the member's host with the member's MAC as inner destination (that host's vSwitch
 * translates). From the internet, a packet to EIP:port gets the VIP as destination and goes the same way; a
 * member's reply from VIP:port to the internet leaves with the EIP as source. New connections and established
 * ones are decided here; Python sees ARP, unresolved next hops, and what is not well-formed TCP/UDP for a
 * listener (lb_stage.py decides it the same way, counts and drops it). */
#include <string.h>

#include "tj_loop.h"
#include "tj_ip4.h"

static void lock(dp_t *dp) { lb_lock(dp->lb); }
static void unlock(dp_t *dp) { lb_unlock(dp->lb); }

/* the VIP (vni, ip), or NULL */
static const lb_vip_t *vip_at(const dp_t *dp, uint32_t vni, uint32_t ip) {
    uint64_t p;
    return map_get(dp->lbm.vips, ((uint64_t)vni << 32 | ip) + 1, &p) ? (const lb_vip_t *)(uintptr_t)p : NULL;
}

/* the pool (<< 1 | source-only) + 1 of the VIP's listener on (proto, port), or 0 */
static uint64_t listener_at(const lb_vip_t *v, uint8_t proto, uint16_t port) {
    uint64_t pool;
    return v && map_get(v->listeners, ((uint64_t)(proto == 17) << 16 | port) + 1, &pool) ? pool + 1 : 0;
}

/* the member for a connection to listener pl, re-encapsulated at o (ENCAP bytes before the inner frame e of elen
 * bytes) to the member's host: the output port, ACT_DROP (no member) or ACT_PUNT (its host not resolved) */
static int to_member(dp_t *dp, uint64_t pl, uint32_t vni, uint8_t *o, uint8_t *e, uint32_t elen, const ip4_t *ip,
                     uint16_t sport, uint16_t dport, uint32_t vip, double now, uint32_t *rewrite_dst) {
    uint32_t pool = (uint32_t)((pl - 1) >> 1);
    int64_t member = (pl - 1) & 1 ? lb_pick_locked(dp->lb, pool, vni, ip->src, 0, 0, 0, 0, now)
                                  : lb_pick_locked(dp->lb, pool, vni, ip->src, vip, sport, dport, ip->proto, now);
    uint64_t key, p, nh, rmac;
    if (member < 0 || !map_get(dp->lbm.members, (uint64_t)member + 1, &key) || !map_get(dp->endpoints, key, &p)) {
        dp->c[C_lb_no_member]++;
        return ACT_DROP;
    }
    const tj_endpoint_t *ep = (const tj_endpoint_t *)(uintptr_t)p;
    if (!map_get(dp->routers, vni | (1ULL << 32), &rmac) ||
        !map_get(dp->neigh[DP_UL], ep->vtep | (1ULL << 32), &nh))
        return ACT_PUNT;  /* the member's host not resolved yet: Python ARPs (and picks the same member) */
    if (rewrite_dst) ip4_rewrite_addr(e + 14, ip, 0, *rewrite_dst);
    dp_encap_to(dp, o, e, elen, ep->mac, rmac, nh, ep->vtep, vni);
    dp->c[C_lb_to_member]++;
    return DP_UL;
}

/* a well-formed, unfragmented TCP/UDP packet at b: 1 with its header and ports */
static int l4_packet(const uint8_t *b, uint32_t len, ip4_t *ip, uint16_t *sport, uint16_t *dport) {
    uint8_t unused;
    return ip4_parse(b, len, ip) && !ip->frag && (ip->proto == 6 || ip->proto == 17) &&
           ip4_ports(b, ip, sport, dport, &unused);
}

static int from_underlay(dp_t *dp, uint8_t *d, uint32_t len, double now, uint8_t **out, uint32_t *out_len) {
    uint32_t vni;
    int act = dp_vxlan_in(dp, d, len, &vni);
    if (act != 0) return act;
    uint8_t *e = d + ENCAP, *b = e + 14;
    ip4_t ip; uint16_t sport, dport;
    if (!l4_packet(b, len - ENCAP - 14, &ip, &sport, &dport)) return ACT_PUNT;
    uint64_t pl, nh;
    const lb_vip_t *v;
    if ((pl = listener_at(vip_at(dp, vni, ip.dst), ip.proto, dport))) {
        act = to_member(dp, pl, vni, d, e, len - ENCAP, &ip, sport, dport, ip.dst, now, NULL);
        if (act >= 0) { *out = d; *out_len = len; }
        return act;
    }
    /* a member's reply from VIP:listener port to the internet, through the VIP's EIP homed here */
    if (!(v = vip_at(dp, vni, ip.src)) || !v->eip || !listener_at(v, ip.proto, sport))
        return ACT_PUNT;  /* not for a listener: Python counts and drops it */
    if (!map_get(dp->neigh[DP_EXT], dp_ext_hop(dp, ip.dst) | (1ULL << 32), &nh)) return ACT_PUNT;  /* Python ARPs */
    ip4_rewrite_addr(b, &ip, 1, v->eip);
    mac_out(e, nh); memcpy(e + 6, dp->mac[DP_EXT], 6);
    *out = e; *out_len = len - ENCAP;
    dp->c[C_fast_out]++;
    return DP_EXT;
}

/* from the internet: EIP:listener port -> the VIP, to its member */
static int from_external(dp_t *dp, uint8_t *d, uint32_t len, double now, uint8_t **out, uint32_t *out_len) {
    ip4_t ip; uint16_t sport, dport;
    uint64_t p, pl;
    if (!l4_packet(d + 14, len - 14, &ip, &sport, &dport) || !map_get(dp->lbm.eips, ip.dst | (1ULL << 32), &p) ||
        !(pl = listener_at((const lb_vip_t *)(uintptr_t)p, ip.proto, dport)))
        return ACT_PUNT;
    const lb_vip_t *v = (const lb_vip_t *)(uintptr_t)p;
    uint32_t vni = v->vni, vip = v->vip;
    int act = to_member(dp, pl, vni, d - ENCAP, d, len, &ip, sport, dport, vip, now, &vip);
    if (act >= 0) { *out = d - ENCAP; *out_len = len + ENCAP; dp->c[C_fast_in]++; }
    return act;
}

static int decide(dp_t *dp, int port, uint8_t *d, uint32_t len, double now, uint8_t **out, uint32_t *out_len) {
    int act = dp_ipv4_for_us(dp, port, d, len);
    if (act != 0) return act;
    return port == DP_UL ? from_underlay(dp, d, len, now, out, out_len) : from_external(dp, d, len, now, out, out_len);
}

const stage_t STAGE_LB = {.lock = lock, .unlock = unlock, .decide = decide};

void dp_use_lb(dp_t *dp, lb_t *lb) {
    pthread_mutex_lock(&dp->cfg);
    dp->lb = lb; dp->stage = &STAGE_LB;
    pthread_mutex_unlock(&dp->cfg);
}

/* --- per-VPC configuration ------------------------------------------------------------------------------- */
static lb_vpc_t *lb_vpc(const dp_t *dp, uint32_t vni) {
    uint64_t p;
    return map_get(dp->lbm.vpcs, vni | 1ULL << 32, &p) ? (lb_vpc_t *)(uintptr_t)p : NULL;
}

static void lb_vpc_free(lb_vpc_t *v) {
    if (!v) return;
    for (uint32_t i = 0; v->vips && i < v->nvips; i++) map_free(v->vips[i].listeners);
    free(v->vips); free(v->members); free(v);
}

/* a VPC's record built from what Python handed over (VIPs grouped, their listeners mapped), or NULL */
static lb_vpc_t *lb_vpc_build(uint32_t vni, const tj_lb_listener_t *l, uint32_t nl, const tj_lb_member_t *m,
                              uint32_t nm) {
    lb_vpc_t *v = calloc(1, sizeof *v);
    if (!v) return NULL;
    v->vips = calloc(nl ? nl : 1, sizeof(lb_vip_t));
    v->members = malloc(sizeof(uint32_t) * (nm ? nm : 1));
    if (!v->vips || !v->members) { lb_vpc_free(v); return NULL; }
    for (uint32_t i = 0; i < nl; i++) {
        lb_vip_t *x = NULL;
        for (uint32_t k = 0; k < v->nvips && !x; k++) if (v->vips[k].vip == l[i].vip) x = &v->vips[k];
        if (!x) {
            x = &v->vips[v->nvips++];
            x->vni = vni; x->vip = l[i].vip;
            if (!(x->listeners = map_new(4))) { lb_vpc_free(v); return NULL; }
        }
        if (l[i].eip) x->eip = l[i].eip;
        if (map_grow_put(&x->listeners, ((uint64_t)(l[i].is_udp != 0) << 16 | l[i].port) + 1,
                         (uint64_t)l[i].pool << 1 | (l[i].src_only != 0))) { lb_vpc_free(v); return NULL; }
    }
    for (uint32_t i = 0; i < nm; i++) v->members[i] = m[i].id;
    v->nmembers = nm;
    return v;
}

/* under dp->cfg: the VPC's keys out of the shared maps */
static void lb_unindex(dp_t *dp, const lb_vpc_t *v) {
    for (uint32_t i = 0; i < v->nvips; i++) {
        const lb_vip_t *x = &v->vips[i];
        uint64_t p;
        map_del(dp->lbm.vips, ((uint64_t)x->vni << 32 | x->vip) + 1);
        if (x->eip && map_get(dp->lbm.eips, x->eip | 1ULL << 32, &p) && p == (uint64_t)(uintptr_t)x)
            map_del(dp->lbm.eips, x->eip | 1ULL << 32);
    }
    for (uint32_t i = 0; i < v->nmembers; i++) map_del(dp->lbm.members, (uint64_t)v->members[i] + 1);
}

int dp_set_lb_vpc(dp_t *dp, uint32_t vni, const tj_lb_listener_t *l, uint32_t nl, const tj_lb_member_t *m,
                  uint32_t nm) {
    lb_vpc_t *v = lb_vpc_build(vni, l, nl, m, nm);
    if (!v) return -1;
    pthread_mutex_lock(&dp->cfg);
    if (map_reserve(&dp->lbm.vpcs, 1) || map_reserve(&dp->lbm.vips, v->nvips) ||
        map_reserve(&dp->lbm.eips, v->nvips) || map_reserve(&dp->lbm.members, nm)) {
        pthread_mutex_unlock(&dp->cfg);
        lb_vpc_free(v);
        return -1;
    }
    lb_vpc_t *old = lb_vpc(dp, vni);
    if (old) lb_unindex(dp, old);
    for (uint32_t i = 0; i < v->nvips; i++) {
        lb_vip_t *x = &v->vips[i];
        map_put(dp->lbm.vips, ((uint64_t)vni << 32 | x->vip) + 1, (uint64_t)(uintptr_t)x);
        if (x->eip) map_put(dp->lbm.eips, x->eip | 1ULL << 32, (uint64_t)(uintptr_t)x);
    }
    for (uint32_t i = 0; i < nm; i++)
        map_put(dp->lbm.members, (uint64_t)m[i].id + 1, ((uint64_t)vni << 32 | m[i].ip) + 1);
    map_put(dp->lbm.vpcs, vni | 1ULL << 32, (uint64_t)(uintptr_t)v);
    pthread_mutex_unlock(&dp->cfg);
    lb_vpc_free(old);
    return 0;
}

uint64_t dp_get_listener(dp_t *dp, uint32_t vni, uint32_t vip, uint8_t is_udp, uint16_t port) {
    pthread_mutex_lock(&dp->cfg);
    uint64_t pl = listener_at(vip_at(dp, vni, vip), is_udp ? 17 : 6, port);
    pthread_mutex_unlock(&dp->cfg);
    return pl;
}

int dp_remove_lb_vpc(dp_t *dp, uint32_t vni) {
    pthread_mutex_lock(&dp->cfg);
    lb_vpc_t *old = lb_vpc(dp, vni);
    if (old) { lb_unindex(dp, old); map_del(dp->lbm.vpcs, vni | 1ULL << 32); }
    pthread_mutex_unlock(&dp->cfg);
    lb_vpc_free(old);
    return old ? 0 : -1;
}
