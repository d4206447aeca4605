/* The load balancer's stage of the packet loop: a client's packet to VIP:port, in VXLAN from a vSwitch, goes on
 * unchanged to the member the connection table (lb_stage.c: the connection's member, or the pool's Maglev entry)
 * picks, re-encapsulated to the member's host with the member's MAC as inner destination (that host's vSwitch
 * translates). New connections and established ones are decided here; Python sees what is not for a listener
 * (the EIP's replies, strays, to count and drop), unknown next hops, ARP and the external side. */
#include <string.h>

#include "tj_dp.h"

static void lock(dp_t *dp) { lb_lock(dp->lb); }
static void unlock(dp_t *dp) { lb_unlock(dp->lb); }

/* the pool (<< 1 | source-only) of a listener, or 0 */
static uint64_t listener(const lb_maps_t *m, uint32_t vni, uint32_t vip, uint8_t proto, uint16_t port) {
    uint64_t idx, pool;
    if (!map_get(m->vips, ((uint64_t)vni << 32 | vip) + 1, &idx)) return 0;
    if (!map_get(m->listeners, (idx << 24 | (uint64_t)(proto == 17) << 16 | port) + 1, &pool)) return 0;
    return pool + 1;
}

static int from_underlay(dp_t *dp, uint8_t *d, uint32_t len, double now, uint8_t **out, uint32_t *out_len) {
    uint32_t vni;
    int act = dp_vxlan_in(dp, d, len, &vni);
    if (act != 0) return act;
    uint8_t *ip = d + ENCAP + 14;
    uint32_t ilen = len - ENCAP - 14, ihl = (ip[0] & 0x0f) * 4u;
    if ((ip[0] >> 4) != 4 || ihl < 20 || ilen < ihl + 8 || (rd16(ip + 6) & 0x3fff)) return ACT_PUNT;
    uint8_t proto = ip[9];
    if (proto != 6 && proto != 17) return ACT_PUNT;
    uint32_t src = rd32(ip + 12), dst = rd32(ip + 16);
    uint16_t sport = rd16(ip + ihl), dport = rd16(ip + ihl + 2);
    uint64_t pl = listener(&dp->lbm, vni, dst, proto, dport);
    if (!pl) return ACT_PUNT;  /* not a listener's: Python counts it (or sends a reply out through the EIP) */
    uint32_t pool = (uint32_t)((pl - 1) >> 1);
    int64_t member = (pl - 1) & 1 ? lb_pick_locked(dp->lb, pool, vni, src, 0, 0, 0, 0, now)
                                  : lb_pick_locked(dp->lb, pool, vni, src, dst, sport, dport, proto, now);
    uint64_t key, ep, nh, rmac;
    if (member < 0 || !map_get(dp->lbm.members, (uint64_t)member + 1, &key) || !map_get(dp->endpoints, key, &ep)) {
        dp->c[C_lb_no_member]++;
        return ACT_DROP;
    }
    if (!map_get(dp->routers, vni | (1ULL << 32), &rmac) ||
        !map_get(dp->neigh[DP_UL], (ep >> 16) | (1ULL << 32), &nh))
        return ACT_PUNT;  /* the member's host not resolved yet: Python ARPs (and picks the same member) */
    uint8_t *e = ip - 14;
    memcpy(e, dp->ep_mac[ep & 0xffff], 6); mac_out(e + 6, rmac);
    dp_vxlan_encap(dp, d, nh, (uint32_t)(ep >> 16), vni, dp_flow_entropy(ip), len - ENCAP);
    *out = d; *out_len = len;
    dp->c[C_lb_to_member]++;
    return DP_UL;
}

static int decide(dp_t *dp, int port, uint8_t *d, uint32_t len, double now, uint8_t **out, uint32_t *out_len) {
    if (len < 14) { dp->c[C_drop_malformed]++; return ACT_DROP; }
    uint16_t et = rd16(d + 12);
    if (et == 0x0806) return ACT_PUNT;
    if (et != 0x0800 || memcmp(d, dp->mac[port], 6) != 0) { dp->c[C_ignored]++; return ACT_DROP; }
    return port == DP_UL ? from_underlay(dp, d, len, now, out, out_len) : ACT_PUNT;  /* the EIP's side: Python */
}

const stage_t STAGE_LB = {lock, unlock, decide};

void dp_use_lb(dp_t *dp, lb_t *lb) {
    pthread_mutex_lock(&dp->cfg);
    dp->lb = lb; dp->stage = &STAGE_LB;
    pthread_mutex_unlock(&dp->cfg);
}

int dp_set_lb(dp_t *dp, const uint32_t *l_vni, const uint32_t *l_vip, const uint8_t *l_udp, const uint16_t *l_port,
              const uint32_t *l_pool, const uint8_t *l_src_only, uint32_t nl, const uint32_t *m_id,
              const uint32_t *m_vni, const uint32_t *m_ip, uint32_t nm) {
    lb_maps_t m = {map_new(nl), map_new(nl), map_new(nm)};
    int full = !m.vips || !m.listeners || !m.members;
    uint64_t nvips = 0;
    for (uint32_t i = 0; !full && i < nl; i++) {
        uint64_t k = ((uint64_t)l_vni[i] << 32 | l_vip[i]) + 1, idx;
        if (!map_get(m.vips, k, &idx)) { idx = nvips++; full |= map_put(m.vips, k, idx); }
        full |= map_put(m.listeners, (idx << 24 | (uint64_t)(l_udp[i] != 0) << 16 | l_port[i]) + 1,
                        (uint64_t)l_pool[i] << 1 | (l_src_only[i] != 0));
    }
    for (uint32_t i = 0; !full && i < nm; i++)
        full |= map_put(m.members, (uint64_t)m_id[i] + 1, ((uint64_t)m_vni[i] << 32 | m_ip[i]) + 1);
    if (full) { map_free(m.vips); map_free(m.listeners); map_free(m.members); return -1; }
    pthread_mutex_lock(&dp->cfg);
    lb_maps_t old = dp->lbm;
    dp->lbm = m;
    pthread_mutex_unlock(&dp->cfg);
    map_free(old.vips); map_free(old.listeners); map_free(old.members);
    return 0;
}
