/* The load balancer's stage of the packet loop: a client's packet to VIP:port, in VXLAN from a vSwitch, goes on
 * unchanged to the member the connection table (lb_stage.c: the connection's member, or the pool's Maglev entry)
 * picks, re-encapsulated to the member's host with the member's MAC as inner destination (that host's vSwitch
 * translates). From the internet, a packet to EIP:port gets the VIP as destination and goes the same way; a
 * member's reply from VIP:port to the internet leaves with the EIP as source. New connections and established
 * ones are decided here; Python sees ARP, unresolved next hops, and what is not well-formed TCP/UDP for a
 * listener (lb_stage.py decides it the same way, counts and drops it). */
#include <string.h>

#include "tj_dp.h"
#include "tj_ip4.h"

static void lock(dp_t *dp) { lb_lock(dp->lb); }
static void unlock(dp_t *dp) { lb_unlock(dp->lb); }

/* the pool (<< 1 | source-only) + 1 of the listener on VIP index idx, or 0 */
static uint64_t listener_at(const lb_maps_t *m, uint64_t idx, uint8_t proto, uint16_t port) {
    uint64_t pool;
    return map_get(m->listeners, (idx << 24 | (uint64_t)(proto == 17) << 16 | port) + 1, &pool) ? pool + 1 : 0;
}

/* the member for a connection to listener pl, re-encapsulated at o (ENCAP bytes before the inner frame e of elen
 * bytes) to the member's host: the output port, ACT_DROP (no member) or ACT_PUNT (its host not resolved) */
static int to_member(dp_t *dp, uint64_t pl, uint32_t vni, uint8_t *o, uint8_t *e, uint32_t elen, const ip4_t *ip,
                     uint16_t sport, uint16_t dport, uint32_t vip, double now, uint32_t *rewrite_dst) {
    uint32_t pool = (uint32_t)((pl - 1) >> 1);
    int64_t member = (pl - 1) & 1 ? lb_pick_locked(dp->lb, pool, vni, ip->src, 0, 0, 0, 0, now)
                                  : lb_pick_locked(dp->lb, pool, vni, ip->src, vip, sport, dport, ip->proto, now);
    uint64_t key, ep, nh, rmac;
    if (member < 0 || !map_get(dp->lbm.members, (uint64_t)member + 1, &key) || !map_get(dp->endpoints, key, &ep)) {
        dp->c[C_lb_no_member]++;
        return ACT_DROP;
    }
    if (!map_get(dp->routers, vni | (1ULL << 32), &rmac) ||
        !map_get(dp->neigh[DP_UL], (ep >> 16) | (1ULL << 32), &nh))
        return ACT_PUNT;  /* the member's host not resolved yet: Python ARPs (and picks the same member) */
    if (rewrite_dst) ip4_rewrite_addr(e + 14, ip, 0, *rewrite_dst);
    dp_encap_to(dp, o, e, elen, dp->ep_mac[ep & 0xffff], rmac, nh, (uint32_t)(ep >> 16), vni);
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
    uint64_t idx, pl, nh;
    if (map_get(dp->lbm.vips, ((uint64_t)vni << 32 | ip.dst) + 1, &idx) &&
        (pl = listener_at(&dp->lbm, idx, ip.proto, dport))) {
        act = to_member(dp, pl, vni, d, e, len - ENCAP, &ip, sport, dport, ip.dst, now, NULL);
        if (act >= 0) { *out = d; *out_len = len; }
        return act;
    }
    /* a member's reply from VIP:listener port to the internet, through the VIP's EIP homed here */
    if (!map_get(dp->lbm.vips, ((uint64_t)vni << 32 | ip.src) + 1, &idx) || !dp->lbm.eip[idx] ||
        !listener_at(&dp->lbm, idx, ip.proto, sport))
        return ACT_PUNT;  /* not for a listener: Python counts and drops it */
    if (!map_get(dp->neigh[DP_EXT], ip.dst | (1ULL << 32), &nh)) return ACT_PUNT;  /* Python ARPs */
    ip4_rewrite_addr(b, &ip, 1, dp->lbm.eip[idx]);
    mac_out(e, nh); memcpy(e + 6, dp->mac[DP_EXT], 6);
    *out = e; *out_len = len - ENCAP;
    dp->c[C_fast_out]++;
    return DP_EXT;
}

/* from the internet: EIP:listener port -> the VIP, to its member */
static int from_external(dp_t *dp, uint8_t *d, uint32_t len, double now, uint8_t **out, uint32_t *out_len) {
    ip4_t ip; uint16_t sport, dport;
    uint64_t idx, pl;
    if (!l4_packet(d + 14, len - 14, &ip, &sport, &dport) || !map_get(dp->lbm.eips, ip.dst | (1ULL << 32), &idx) ||
        !(pl = listener_at(&dp->lbm, idx, ip.proto, dport)))
        return ACT_PUNT;
    uint32_t vni = (uint32_t)(dp->lbm.vip[idx] >> 32), vip = (uint32_t)dp->lbm.vip[idx];
    int act = to_member(dp, pl, vni, d - ENCAP, d, len, &ip, sport, dport, vip, now, &vip);
    if (act >= 0) { *out = d - ENCAP; *out_len = len + ENCAP; dp->c[C_fast_in]++; }
    return act;
}

static int decide(dp_t *dp, int port, uint8_t *d, uint32_t len, double now, uint8_t **out, uint32_t *out_len) {
    int act = dp_ipv4_for_us(dp, port, d, len);
    if (act != 0) return act;
    return port == DP_UL ? from_underlay(dp, d, len, now, out, out_len) : from_external(dp, d, len, now, out, out_len);
}

const stage_t STAGE_LB = {lock, unlock, decide};

void dp_use_lb(dp_t *dp, lb_t *lb) {
    pthread_mutex_lock(&dp->cfg);
    dp->lb = lb; dp->stage = &STAGE_LB;
    pthread_mutex_unlock(&dp->cfg);
}

int dp_set_lb(dp_t *dp, const uint32_t *l_vni, const uint32_t *l_vip, const uint8_t *l_udp, const uint16_t *l_port,
              const uint32_t *l_pool, const uint8_t *l_src_only, const uint32_t *l_eip, uint32_t nl,
              const uint32_t *m_id, const uint32_t *m_vni, const uint32_t *m_ip, uint32_t nm) {
    lb_maps_t m = {map_new(nl), map_new(nl), map_new(nm), map_new(nl), calloc(nl ? nl : 1, 8),
                   calloc(nl ? nl : 1, 4)};
    int full = !m.vips || !m.listeners || !m.members || !m.eips || !m.vip || !m.eip;
    uint64_t nvips = 0;
    for (uint32_t i = 0; !full && i < nl; i++) {
        uint64_t k = ((uint64_t)l_vni[i] << 32 | l_vip[i]), idx;
        if (!map_get(m.vips, k + 1, &idx)) { idx = nvips++; m.vip[idx] = k; full |= map_put(m.vips, k + 1, idx); }
        full |= map_put(m.listeners, (idx << 24 | (uint64_t)(l_udp[i] != 0) << 16 | l_port[i]) + 1,
                        (uint64_t)l_pool[i] << 1 | (l_src_only[i] != 0));
        if (l_eip[i]) { m.eip[idx] = l_eip[i]; full |= map_put(m.eips, l_eip[i] | (1ULL << 32), idx); }
    }
    for (uint32_t i = 0; !full && i < nm; i++)
        full |= map_put(m.members, (uint64_t)m_id[i] + 1, ((uint64_t)m_vni[i] << 32 | m_ip[i]) + 1);
    pthread_mutex_lock(&dp->cfg);
    lb_maps_t old = full ? m : dp->lbm;  /* a config that did not fit is refused whole */
    if (!full) dp->lbm = m;
    pthread_mutex_unlock(&dp->cfg);
    map_free(old.vips); map_free(old.listeners); map_free(old.members); map_free(old.eips);
    free(old.vip); free(old.eip);
    return full ? -1 : 0;
}
