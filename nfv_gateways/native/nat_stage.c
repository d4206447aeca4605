/* The NAT translation stage: lookups and translation, the loop's new flows (interface and contract in
 * include/tj_nat.h; the mappings' life is nat_flows.c's, the table nat_table.c's). */
#include <stdlib.h>
#include <string.h>

#include "tj_ip4.h"
#include "tj_nat_table.h"

nat_t *nat_create(uint32_t cap_pow2) {
    nat_t *n = calloc(1, sizeof(nat_t));
    if (!n) return NULL;
    if (nat_table_init(n, cap_pow2) != 0) { free(n); return NULL; }
    nat_flows_init(n);
    n->mtu = 1450;
    n->ext_mtu = 1500;
    pthread_mutex_init(&n->mu, NULL);
    return n;
}

void nat_set_mtu(nat_t *n, uint32_t mtu) { n->mtu = mtu; }
void nat_set_external_mtu(nat_t *n, uint32_t mtu) { n->ext_mtu = mtu; }

void nat_destroy(nat_t *n) {
    if (!n) return;
    nat_table_free(n);
    nat_vpcs_free(n);
    nat_flows_free(n);
    free(n);
}

static uint32_t mtu_of(const nat_t *n, uint32_t vni) {
    const vpc_nat_t *v = nat_vpc(n, vni);
    return v && v->mtu ? v->mtu : n->mtu;
}

static int served(const nat_t *n, uint32_t eip) {
    uint64_t refs;
    return map_get(n->served, eip | 1ULL << 32, &refs);
}

static int outbound_(nat_t *n, uint32_t vni, uint8_t *b, uint32_t len, double now) {
    ip4_t ip; uint16_t sp = 0, dp = 0; uint8_t it = 0;
    if (!ip4_parse(b, len, &ip) || ip.frag || b[8] <= 1 || ip.total > n->ext_mtu || !ip4_ports(b, &ip, &sp, &dp, &it))
        goto miss;
    if (served(n, ip.dst)) goto miss;                                        /* hairpin */
    uint64_t st, refs;
    if (map_get(n->static_in, TAG | (uint64_t)vni << 32 | ip.src, &st)) {   /* a 1:1 EIP: the address only */
        ip4_rewrite_addr(b, &ip, 1, (uint32_t)st);
        ip4_dec_ttl(b);
        n->hits_out++;
        return NAT_OUT;
    }
    if (map_get(n->dnat_out, dnat_out_key(vni, ip.src, sp, ip.proto), &refs)) goto miss;
    uint16_t peer_port = ip.proto == 1 ? 0 : dp;
    int32_t idx = nat_find_in(n, vni, ip.src, sp, ip.proto);
    if (idx < 0 && (idx = nat_create_for(n, vni, ip.src, sp, ip.proto, ip.dst, peer_port, now)) < 0) goto miss;
    mapping_t *s = &n->slots[idx];
    if (!nat_has_peer(s, ip.dst, peer_port)) n->peers_replaced += (uint64_t)nat_add_peer(s, ip.dst, peer_port);
    s->last = now;
    if (ip.proto == 6 && (b[ip.l4 + 13] & 0x05)) s->closing = 1;             /* FIN/RST */
    ip4_rewrite_addr(b, &ip, 1, s->eip);
    ip4_rewrite_port(b, &ip, 1, s->eport);
    ip4_dec_ttl(b);
    n->hits_out++;
    return NAT_OUT;
miss:
    n->misses++;
    return NAT_MISS;
}

static int inbound_(nat_t *n, uint8_t *b, uint32_t len, double now, uint32_t *out_vni, uint32_t *out_ip) {
    ip4_t ip; uint16_t sp = 0, dp = 0; uint8_t it = 0;
    if (!ip4_parse(b, len, &ip) || ip.frag || b[8] <= 1) goto miss;
    if (!served(n, ip.dst)) goto miss;
    int has_ports = ip4_ports(b, &ip, &sp, &dp, &it);
    uint64_t v, refs;
    if (map_get(n->static_out, ip.dst | 1ULL << 32, &v)) {                  /* a 1:1 EIP: any protocol */
        if ((ip.proto == 6 || ip.proto == 17) && !has_ports) goto miss;     /* truncated: Python decides */
        if (ip.total > mtu_of(n, (uint32_t)(v >> 32))) goto miss;
        ip4_rewrite_addr(b, &ip, 0, (uint32_t)v);
        ip4_dec_ttl(b);
        *out_vni = (uint32_t)(v >> 32); *out_ip = (uint32_t)v;
        n->hits_in++;
        return NAT_IN;
    }
    if (!has_ports || (ip.proto == 1 && it != 0)) goto miss;                 /* echo replies only */
    if (ip.proto != 1 && map_get(n->dnat_in, TAG | (uint64_t)ip.dst << 24 | (uint64_t)dp << 8 | ip.proto, &refs))
        goto miss;
    int32_t idx = nat_find_out(n, ip.dst, dp, ip.proto);
    if (idx < 0) goto miss;
    mapping_t *s = &n->slots[idx];
    if (!nat_has_peer(s, ip.src, ip.proto == 1 ? 0 : sp) || ip.total > mtu_of(n, s->vni)) goto miss;
    s->last = now;
    if (ip.proto == 6) {
        uint8_t fl = b[ip.l4 + 13];
        if (fl & 0x05) s->closing = 1;
        else if (fl & 0x10) s->established = 1;
    }
    ip4_rewrite_addr(b, &ip, 0, s->ip);
    if (ip.proto == 1) ip4_rewrite_port(b, &ip, 1, s->port); else ip4_rewrite_port(b, &ip, 0, s->port);
    ip4_dec_ttl(b);
    *out_vni = s->vni; *out_ip = s->ip;
    n->hits_in++;
    return NAT_IN;
miss:
    n->misses++;
    return NAT_MISS;
}

int nat_outbound(nat_t *n, uint32_t vni, uint8_t *b, uint32_t len, double now) { LOCKED(n, outbound_(n, vni, b, len, now)); }
int nat_inbound(nat_t *n, uint8_t *b, uint32_t len, double now, uint32_t *out_vni, uint32_t *out_ip) {
    LOCKED(n, inbound_(n, b, len, now, out_vni, out_ip));
}

void nat_lock(nat_t *n) { pthread_mutex_lock(&n->mu); }
void nat_unlock(nat_t *n) { pthread_mutex_unlock(&n->mu); }
int nat_outbound_locked(nat_t *n, uint32_t vni, uint8_t *b, uint32_t len, double now) {
    return outbound_(n, vni, b, len, now);
}
int nat_inbound_locked(nat_t *n, uint8_t *b, uint32_t len, double now, uint32_t *out_vni, uint32_t *out_ip) {
    return inbound_(n, b, len, now, out_vni, out_ip);
}

void nat_stats(nat_t *n, uint64_t *out5) {
    out5[0] = n->hits_out; out5[1] = n->hits_in; out5[2] = n->misses; out5[3] = n->created;
    out5[4] = n->peers_replaced;
}
