/* IPv4 header parsing and in-place rewriting (addresses, L4 ports, TTL) with incremental checksums: the same
 * arithmetic as nfv_gateways/core/packet.py, so the C stages and the Python reference agree byte for byte. */
#ifndef TJ_IP4_H
#define TJ_IP4_H
#include "tj_bytes.h"

typedef struct { uint32_t ihl, total, l4, src, dst; uint8_t proto; int frag; } ip4_t;

/* 1 for a well-formed IPv4 header with a good checksum that fits in len; 0 otherwise */
static inline int ip4_parse(const uint8_t *b, uint32_t len, ip4_t *ip) {
    if (len < 20 || (b[0] >> 4) != 4) return 0;
    ip->ihl = (b[0] & 0xfu) * 4;
    ip->total = rd16(b + 2);
    if (ip->ihl < 20 || ip->total < ip->ihl || ip->total > len) return 0;
    if (csum(b, ip->ihl) != 0) return 0;
    uint16_t frag = rd16(b + 6);
    ip->frag = (frag & 0x1fff) || (frag & 0x2000);
    ip->proto = b[9]; ip->src = rd32(b + 12); ip->dst = rd32(b + 16); ip->l4 = ip->ihl;
    return 1;
}

/* ports (or the echo identifier, in both); 0 if not a TCP, UDP or echo header that fits */
static inline int ip4_ports(const uint8_t *b, const ip4_t *ip, uint16_t *sp, uint16_t *dp, uint8_t *icmp_type) {
    uint32_t room = ip->total - ip->l4;
    const uint8_t *l4 = b + ip->l4;
    if (ip->proto == 6 && room >= 20) { *sp = rd16(l4); *dp = rd16(l4 + 2); return 1; }
    if (ip->proto == 17 && room >= 8) { *sp = rd16(l4); *dp = rd16(l4 + 2); return 1; }
    if (ip->proto == 1 && room >= 8 && (l4[0] == 8 || l4[0] == 0)) {
        *icmp_type = l4[0]; *sp = *dp = rd16(l4 + 4); return 1;
    }
    return 0;
}

static inline void ip4_rewrite_addr(uint8_t *b, const ip4_t *ip, int is_src, uint32_t new_) {
    uint32_t off = is_src ? 12 : 16, old = rd32(b + off);
    wr32(b + off, new_);
    wr16(b + 10, upd32(rd16(b + 10), old, new_));
    if (ip->proto == 6 || ip->proto == 17) {
        uint32_t ck_off = ip->l4 + (ip->proto == 6 ? 16 : 6);
        uint16_t ck = rd16(b + ck_off);
        if (ip->proto == 17 && ck == 0) return;  /* UDP without a checksum stays without */
        ck = upd32(ck, old, new_);
        if (ip->proto == 17 && ck == 0) ck = 0xffff;
        wr16(b + ck_off, ck);
    }
}

static inline void ip4_rewrite_port(uint8_t *b, const ip4_t *ip, int is_src, uint16_t new_) {
    uint32_t ck_off = ip->l4 + (ip->proto == 6 ? 16 : ip->proto == 17 ? 6 : 2);
    uint32_t f = ip->proto == 1 ? ip->l4 + 4 : ip->l4 + (is_src ? 0 : 2);
    uint16_t ck = rd16(b + ck_off), old = rd16(b + f);
    int nock = ip->proto == 17 && ck == 0;
    wr16(b + f, new_);
    if (!nock) ck = upd16(ck, old, new_);
    if (ip->proto == 17 && !nock && ck == 0) ck = 0xffff;
    wr16(b + ck_off, ck);
}

/* a gateway is a routing hop: TTL - 1; a TTL that would run out is Python's (it answers time exceeded) */
static inline void ip4_dec_ttl(uint8_t *b) {
    uint16_t old = rd16(b + 8);
    b[8]--;
    wr16(b + 10, upd16(rd16(b + 10), old, rd16(b + 8)));
}
#endif
