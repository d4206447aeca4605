/* Tianji NAT fast path: translates packets of established mappings, byte for byte as nfv_gateways/nat.py does.
 *
 * Python owns everything else: it creates mappings (the slow path), pushes them here, expires them, and reads
 * back the last-seen times and TCP state (established, closing: both only ever go from 0 to 1, so merging the two
 * views is an OR). Anything this code is not sure about (no mapping, new peer, hairpin, static EIPs, DNAT, ICMP
 * errors, fragments, malformed headers) returns NAT_MISS so Python decides: the fast path never disagrees with the
 * reference, it only declines.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NAT_MISS 0
#define NAT_OUT 1
#define NAT_IN 2
#define MAX_PEERS 4

typedef struct {
    uint32_t vni, ip, eip;
    uint16_t port, eport;
    uint8_t proto, used, established, closing, npeers;
    uint32_t peer_ip[MAX_PEERS];
    uint16_t peer_port[MAX_PEERS];
    double last;
} mapping_t;

typedef struct {
    uint32_t cap;            /* power of two */
    mapping_t *slots;        /* open addressing on the inside key */
    int32_t *out_index;      /* open addressing on the outside key -> slot, -1 empty, -2 deleted */
    uint32_t *special;       /* EIPs the fast path must leave to Python (static, DNAT) */
    uint32_t nspecial;
    uint32_t *served;
    uint32_t nserved;
    uint64_t hits_out, hits_in, misses;
    pthread_mutex_t mu;      /* Python's table updates vs the packet loop's bursts */
} nat_t;

static uint32_t mix(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL; x ^= x >> 33;
    return (uint32_t)x;
}
static uint32_t h_in(uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto) {
    return mix(((uint64_t)vni << 40) ^ ((uint64_t)ip << 8) ^ ((uint64_t)port << 24) ^ proto);
}
static uint32_t h_out(uint32_t eip, uint16_t eport, uint8_t proto) {
    return mix(((uint64_t)eip << 24) ^ ((uint64_t)eport << 8) ^ proto ^ 0x9e3779b97f4a7c15ULL);
}

nat_t *nat_create(uint32_t cap_pow2) {
    nat_t *n = calloc(1, sizeof(nat_t));
    if (!n) return NULL;
    n->cap = cap_pow2;
    n->slots = calloc(cap_pow2, sizeof(mapping_t));
    n->out_index = malloc(sizeof(int32_t) * cap_pow2);
    if (!n->slots || !n->out_index) return NULL;
    for (uint32_t i = 0; i < cap_pow2; i++) n->out_index[i] = -1;
    pthread_mutex_init(&n->mu, NULL);
    return n;
}

void nat_destroy(nat_t *n) {
    if (!n) return;
    free(n->slots); free(n->out_index); free(n->special); free(n->served); free(n);
}

static int set_list(uint32_t **dst, uint32_t *count, const uint32_t *src, uint32_t len) {
    uint32_t *copy = len ? malloc(sizeof(uint32_t) * len) : NULL;
    if (len && !copy) return -1;
    if (len) memcpy(copy, src, sizeof(uint32_t) * len);
    free(*dst); *dst = copy; *count = len;
    return 0;
}
#define LOCKED(n, expr) do { pthread_mutex_lock(&(n)->mu); __typeof__(expr) r_ = (expr); pthread_mutex_unlock(&(n)->mu); return r_; } while (0)
int nat_set_special(nat_t *n, const uint32_t *eips, uint32_t len) { LOCKED(n, set_list(&n->special, &n->nspecial, eips, len)); }
int nat_set_served(nat_t *n, const uint32_t *eips, uint32_t len) { LOCKED(n, set_list(&n->served, &n->nserved, eips, len)); }

static int in_list(const uint32_t *l, uint32_t len, uint32_t v) {
    for (uint32_t i = 0; i < len; i++) if (l[i] == v) return 1;
    return 0;
}

static int32_t find_in(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto) {
    uint32_t m = n->cap - 1, i = h_in(vni, ip, port, proto) & m;
    for (uint32_t k = 0; k < n->cap; k++, i = (i + 1) & m) {
        mapping_t *s = &n->slots[i];
        if (s->used == 0) return -1;
        if (s->used == 1 && s->vni == vni && s->ip == ip && s->port == port && s->proto == proto) return (int32_t)i;
    }
    return -1;
}

static int32_t find_out(nat_t *n, uint32_t eip, uint16_t eport, uint8_t proto) {
    uint32_t m = n->cap - 1, i = h_out(eip, eport, proto) & m;
    for (uint32_t k = 0; k < n->cap; k++, i = (i + 1) & m) {
        int32_t idx = n->out_index[i];
        if (idx == -1) return -1;
        if (idx >= 0) {
            mapping_t *s = &n->slots[idx];
            if (s->used == 1 && s->eip == eip && s->eport == eport && s->proto == proto) return idx;
        }
    }
    return -1;
}

/* Insert or update a mapping (Python's view of it). Returns 0, or -1 when the table is full. */
static int del_(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto) {
    int32_t idx = find_in(n, vni, ip, port, proto);
    if (idx < 0) return -1;
    mapping_t *s = &n->slots[idx];
    uint32_t m = n->cap - 1, j = h_out(s->eip, s->eport, proto) & m;
    for (uint32_t k = 0; k < n->cap; k++, j = (j + 1) & m)
        if (n->out_index[j] == idx) { n->out_index[j] = -2; break; }
    s->used = 2; /* tombstone keeps probe chains intact */
    return 0;
}

static int put_(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto, uint32_t eip, uint16_t eport,
                uint8_t established, uint8_t closing, const uint32_t *peer_ip, const uint16_t *peer_port,
                uint8_t npeers, double last) {
    int32_t idx = find_in(n, vni, ip, port, proto);
    uint32_t m = n->cap - 1;
    if (idx >= 0 && (n->slots[idx].eip != eip || n->slots[idx].eport != eport)) {
        del_(n, vni, ip, port, proto);  /* a different mapping under the same inside key: start clean */
        idx = -1;
    }
    if (idx < 0) {
        uint32_t i = h_in(vni, ip, port, proto) & m;
        for (uint32_t k = 0; k < n->cap; k++, i = (i + 1) & m)
            if (n->slots[i].used != 1) { idx = (int32_t)i; break; }
        if (idx < 0) return -1;
        uint32_t j = h_out(eip, eport, proto) & m;
        int placed = 0;
        for (uint32_t k = 0; k < n->cap; k++, j = (j + 1) & m)
            if (n->out_index[j] < 0) { n->out_index[j] = idx; placed = 1; break; }
        if (!placed) return -1;
        n->slots[idx].established = n->slots[idx].closing = 0;
        n->slots[idx].last = 0;
    }
    mapping_t *s = &n->slots[idx];
    /* the loop may have moved this mapping on since Python last looked: merge, never step back */
    s->established |= established; s->closing |= closing;
    if (last > s->last) s->last = last;
    s->vni = vni; s->ip = ip; s->port = port; s->proto = proto; s->eip = eip; s->eport = eport; s->used = 1;
    s->npeers = npeers > MAX_PEERS ? MAX_PEERS : npeers;
    for (uint8_t p = 0; p < s->npeers; p++) { s->peer_ip[p] = peer_ip[p]; s->peer_port[p] = peer_port[p]; }
    return 0;
}

static double last_(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto) {
    int32_t idx = find_in(n, vni, ip, port, proto);
    return idx < 0 ? -1.0 : n->slots[idx].last;
}

/* last-seen time and TCP state bits (1 established, 2 closing); -1.0 when there is no such mapping */
static double state_(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto, uint8_t *bits) {
    int32_t idx = find_in(n, vni, ip, port, proto);
    if (idx < 0) return -1.0;
    *bits = (uint8_t)(n->slots[idx].established | n->slots[idx].closing << 1);
    return n->slots[idx].last;
}

int nat_put(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto, uint32_t eip, uint16_t eport,
            uint8_t established, uint8_t closing, const uint32_t *peer_ip, const uint16_t *peer_port, uint8_t npeers,
            double last) {
    LOCKED(n, put_(n, vni, ip, port, proto, eip, eport, established, closing, peer_ip, peer_port, npeers, last));
}
double nat_state(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto, uint8_t *bits) {
    LOCKED(n, state_(n, vni, ip, port, proto, bits));
}
int nat_del(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto) { LOCKED(n, del_(n, vni, ip, port, proto)); }
double nat_last(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto) { LOCKED(n, last_(n, vni, ip, port, proto)); }

/* --- packet surgery, identical arithmetic to nfv_gateways/packet.py -------------------------------------- */
static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }
static uint32_t rd32(const uint8_t *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }
static void wr16(uint8_t *p, uint16_t v) { p[0] = v >> 8; p[1] = v & 0xff; }
static void wr32(uint8_t *p, uint32_t v) { p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v; }

static uint16_t csum(const uint8_t *d, uint32_t len) {
    uint32_t s = 0;
    for (uint32_t i = 0; i + 1 < len; i += 2) s += rd16(d + i);
    if (len & 1) s += (uint32_t)d[len - 1] << 8;
    while (s >> 16) s = (s & 0xffff) + (s >> 16);
    return (uint16_t)~s;
}
static uint16_t upd16(uint16_t sum, uint16_t old, uint16_t new_) {
    uint32_t s = (uint32_t)(~sum & 0xffff) + (uint32_t)(~old & 0xffff) + new_;
    while (s >> 16) s = (s & 0xffff) + (s >> 16);
    return (uint16_t)~s;
}
static uint16_t upd32(uint16_t sum, uint32_t old, uint32_t new_) {
    return upd16(upd16(sum, old >> 16, new_ >> 16), old & 0xffff, new_ & 0xffff);
}

typedef struct { uint32_t ihl, total, l4, src, dst; uint8_t proto; int frag; } ip4_t;

static int parse(const uint8_t *b, uint32_t len, ip4_t *ip) {
    if (len < 20 || (b[0] >> 4) != 4) return 0;
    ip->ihl = (b[0] & 0xf) * 4;
    ip->total = rd16(b + 2);
    if (ip->ihl < 20 || ip->total < ip->ihl || ip->total > len) return 0;
    if (csum(b, ip->ihl) != 0) return 0;
    uint16_t frag = rd16(b + 6);
    ip->frag = (frag & 0x1fff) || (frag & 0x2000);
    ip->proto = b[9]; ip->src = rd32(b + 12); ip->dst = rd32(b + 16); ip->l4 = ip->ihl;
    return 1;
}

/* ports (or the echo identifier); 0 if not a NAT-able L4 header */
static int ports(const uint8_t *b, const ip4_t *ip, uint16_t *sp, uint16_t *dp, uint8_t *icmp_type) {
    uint32_t room = ip->total - ip->l4;
    const uint8_t *l4 = b + ip->l4;
    if (ip->proto == 6 && room >= 20) { *sp = rd16(l4); *dp = rd16(l4 + 2); return 1; }
    if (ip->proto == 17 && room >= 8) { *sp = rd16(l4); *dp = rd16(l4 + 2); return 1; }
    if (ip->proto == 1 && room >= 8 && (l4[0] == 8 || l4[0] == 0)) {
        *icmp_type = l4[0]; *sp = *dp = rd16(l4 + 4); return 1;
    }
    return 0;
}

static void rewrite_addr(uint8_t *b, const ip4_t *ip, int is_src, uint32_t new_) {
    uint32_t off = is_src ? 12 : 16, old = rd32(b + off);
    wr32(b + off, new_);
    wr16(b + 10, upd32(rd16(b + 10), old, new_));
    if (ip->proto == 6 || ip->proto == 17) {
        uint32_t ck_off = ip->l4 + (ip->proto == 6 ? 16 : 6);
        uint16_t ck = rd16(b + ck_off);
        if (ip->proto == 17 && ck == 0) return;
        ck = upd32(ck, old, new_);
        if (ip->proto == 17 && ck == 0) ck = 0xffff;
        wr16(b + ck_off, ck);
    }
}

static void rewrite_port(uint8_t *b, const ip4_t *ip, int is_src, uint16_t new_) {
    uint32_t ck_off = ip->l4 + (ip->proto == 6 ? 16 : ip->proto == 17 ? 6 : 2);
    uint32_t f = ip->proto == 1 ? ip->l4 + 4 : ip->l4 + (is_src ? 0 : 2);
    uint16_t ck = rd16(b + ck_off), old = rd16(b + f);
    int nock = ip->proto == 17 && ck == 0;
    wr16(b + f, new_);
    if (!nock) ck = upd16(ck, old, new_);
    if (ip->proto == 17 && !nock && ck == 0) ck = 0xffff;
    wr16(b + ck_off, ck);
}

static int has_peer(const mapping_t *s, uint32_t ip, uint16_t port) {
    for (uint8_t p = 0; p < s->npeers; p++) if (s->peer_ip[p] == ip && s->peer_port[p] == port) return 1;
    return 0;
}

static int outbound_(nat_t *n, uint32_t vni, uint8_t *b, uint32_t len, double now) {
    ip4_t ip; uint16_t sp, dp; uint8_t it = 0;
    if (!parse(b, len, &ip) || ip.frag || !ports(b, &ip, &sp, &dp, &it)) goto miss;
    if (in_list(n->served, n->nserved, ip.dst)) goto miss;                   /* hairpin */
    int32_t idx = find_in(n, vni, ip.src, sp, ip.proto);
    if (idx < 0) goto miss;
    mapping_t *s = &n->slots[idx];
    if (in_list(n->special, n->nspecial, s->eip)) goto miss;
    if (!has_peer(s, ip.dst, ip.proto == 1 ? 0 : dp)) goto miss;            /* Python records new peers */
    s->last = now;
    if (ip.proto == 6 && (b[ip.l4 + 13] & 0x05)) s->closing = 1;             /* FIN/RST */
    rewrite_addr(b, &ip, 1, s->eip);
    rewrite_port(b, &ip, 1, s->eport);
    n->hits_out++;
    return NAT_OUT;
miss:
    n->misses++;
    return NAT_MISS;
}

static int inbound_(nat_t *n, uint8_t *b, uint32_t len, double now, uint32_t *out_vni, uint32_t *out_ip) {
    ip4_t ip; uint16_t sp, dp; uint8_t it = 0;
    if (!parse(b, len, &ip) || ip.frag) goto miss;
    if (!in_list(n->served, n->nserved, ip.dst) || in_list(n->special, n->nspecial, ip.dst)) goto miss;
    if (!ports(b, &ip, &sp, &dp, &it) || (ip.proto == 1 && it != 0)) goto miss;  /* echo replies only */
    int32_t idx = find_out(n, ip.dst, dp, ip.proto);
    if (idx < 0) goto miss;
    mapping_t *s = &n->slots[idx];
    if (!has_peer(s, ip.src, ip.proto == 1 ? 0 : sp)) goto miss;
    s->last = now;
    if (ip.proto == 6) {
        uint8_t fl = b[ip.l4 + 13];
        if (fl & 0x05) s->closing = 1;
        else if (fl & 0x10) s->established = 1;
    }
    rewrite_addr(b, &ip, 0, s->ip);
    if (ip.proto == 1) rewrite_port(b, &ip, 1, s->port); else rewrite_port(b, &ip, 0, s->port);
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

/* Bursts: the per-packet loop stays in C; Python only looks at the misses. */
void nat_outbound_burst(nat_t *n, const uint32_t *vnis, uint8_t **bufs, const uint32_t *lens, uint32_t count,
                        double now, int32_t *results) {
    pthread_mutex_lock(&n->mu);
    for (uint32_t i = 0; i < count; i++) results[i] = outbound_(n, vnis[i], bufs[i], lens[i], now);
    pthread_mutex_unlock(&n->mu);
}

void nat_stats(nat_t *n, uint64_t *out3) { out3[0] = n->hits_out; out3[1] = n->hits_in; out3[2] = n->misses; }
