/* The NAT stage of the packet loop: tenant traffic in VXLAN from the underlay goes out translated on the external
 * segment; replies to a mapping come back in, translated, encapsulated to the VM's hypervisor. The translation
 * itself is nat_stage.c's; this file frames it. */
#include <string.h>

#include "tj_loop.h"

static void lock(dp_t *dp) { nat_lock(dp->nat); }
static void unlock(dp_t *dp) { nat_unlock(dp->nat); }

/* VXLAN from a known VTEP and VPC: translate the inner packet and send it out with the next hop's MAC */
static int from_underlay(dp_t *dp, uint8_t *d, uint32_t len, double now, uint8_t **out, uint32_t *out_len) {
    uint32_t vni;
    int act = dp_vxlan_in(dp, d, len, &vni);
    if (act != 0) return act;
    uint8_t *inner = d + ENCAP + 14;
    uint32_t ilen = len - ENCAP - 14;
    uint64_t nh;  /* on-link on the external segment, or its router; unknown neighbour: Python ARPs */
    if (ilen < 20 || !map_get(dp->neigh[DP_EXT], dp_ext_hop(dp, rd32(inner + 16)) | (1ULL << 32), &nh))
        return ACT_PUNT;
    if (nat_outbound_locked(dp->nat, vni, inner, ilen, now) != NAT_OUT) return ACT_PUNT;
    uint8_t *e = inner - 14;
    mac_out(e, nh); memcpy(e + 6, dp->mac[DP_EXT], 6); wr16(e + 12, 0x0800);
    *out = e; *out_len = ilen + 14;
    dp->c[C_fast_out]++;
    return DP_EXT;
}

/* an IPv4 frame to our MAC on the external segment: translate, encapsulate to the VM's hypervisor */
static int from_external(dp_t *dp, uint8_t *d, uint32_t len, double now, uint8_t **out, uint32_t *out_len) {
    uint8_t *ip = d + 14;
    uint32_t ilen = len - 14, vni, inside;
    if (nat_inbound_locked(dp->nat, ip, ilen, now, &vni, &inside) != NAT_IN) return ACT_PUNT;
    uint64_t nh, rmac;
    const tj_endpoint_t *ep = dp_endpoint(dp, vni, inside);
    if (!ep || !map_get(dp->routers, vni | (1ULL << 32), &rmac) ||
        !map_get(dp->neigh[DP_UL], ep->vtep | (1ULL << 32), &nh)) {
        /* translated already (there is no undo): Python gets the IP packet with its VNI and inside address in
         * place of the MAC addresses (punt port DP_PUNT_TRANSLATED) and sends it once it knows the way */
        memset(d, 0, 12);
        wr32(d, vni); wr32(d + 4, inside);
        dp->c[C_fast_in]++;
        ring_push(&dp->punt, DP_PUNT_TRANSLATED, d, len) ? dp->c[C_punt_full]++ : dp->c[C_punt]++;
        return ACT_DROP;
    }
    /* the inner Ethernet header replaces the external one, in place */
    dp_encap_to(dp, d - ENCAP, d, len, ep->mac, rmac, nh, ep->vtep, vni);
    *out = d - ENCAP; *out_len = ENCAP + len;
    dp->c[C_fast_in]++;
    return DP_UL;
}

static int decide(dp_t *dp, int port, uint8_t *d, uint32_t len, double now, uint8_t **out, uint32_t *out_len) {
    int act = dp_ipv4_for_us(dp, port, d, len);
    if (act != 0) return act;
    return port == DP_UL ? from_underlay(dp, d, len, now, out, out_len) : from_external(dp, d, len, now, out, out_len);
}

const stage_t STAGE_NAT = {.lock = lock, .unlock = unlock, .decide = decide};

void dp_use_nat(dp_t *dp, nat_t *nat) {
    pthread_mutex_lock(&dp->cfg);
    dp->nat = nat; dp->stage = &STAGE_NAT;
    pthread_mutex_unlock(&dp->cfg);
}
