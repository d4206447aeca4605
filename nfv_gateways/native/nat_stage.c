/* The NAT translation stage: lookups and translation (interface and contract in include/tj_nat.h; new mappings
 * are nat_create.c's). */
#include <stdlib.h>
#include <string.h>

#include "tj_ip4.h"
#include "tj_nat_table.h"

nat_t *nat_create(uint32_t cap_pow2) {
    nat_t *n = calloc(1, sizeof(nat_t));
    if (!n) return NULL;
    n->cap = cap_pow2;
    n->slots = calloc(cap_pow2, sizeof(mapping_t));
    n->out_index = malloc(sizeof(int32_t) * cap_pow2);
    if (!n->slots || !n->out_index) { free(n->slots); free(n->out_index); free(n); return NULL; }
    for (uint32_t i = 0; i < cap_pow2; i++) n->out_index[i] = -1;
    n->events = calloc(NAT_EVENTS, sizeof(nat_event_t));
    if (!n->events) { free(n->slots); free(n->out_index); free(n); return NULL; }
    n->mtu = 1450;
    n->ext_mtu = 1500;
    n->port_lo = 1024; n->port_hi = 65535;
    pthread_mutex_init(&n->mu, NULL);
    return n;
}

void nat_set_mtu(nat_t *n, uint32_t mtu) { n->mtu = mtu; }
void nat_set_external_mtu(nat_t *n, uint32_t mtu) { n->ext_mtu = mtu; }

void nat_destroy(nat_t *n) {
    if (!n) return;
    free(n->slots); free(n->out_index); free(n->events);
    nat_vpcs_free(n);
    nat_snat_free(n);
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

int32_t nat_find_in(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto) {
    uint32_t m = n->cap - 1, i = h_in(vni, ip, port, proto) & m;
    for (uint32_t k = 0; k < n->cap; k++, i = (i + 1) & m) {
        mapping_t *s = &n->slots[i];
        if (s->used == 0) return -1;
        if (s->used == 1 && s->vni == vni && s->ip == ip && s->port == port && s->proto == proto) return (int32_t)i;
    }
    return -1;
}

int32_t nat_find_out(nat_t *n, uint32_t eip, uint16_t eport, uint8_t proto) {
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

/* a mapping's slot (tombstones reused) and its outside index; the keys set, no peers, no TCP state */
static int32_t place(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto, uint32_t eip, uint16_t eport) {
    uint32_t m = n->cap - 1, i = h_in(vni, ip, port, proto) & m, j = h_out(eip, eport, proto) & m;
    while (n->slots[i].used == 1) i = (i + 1) & m;   /* the caller keeps a quarter of the slots free */
    while (n->out_index[j] >= 0) j = (j + 1) & m;
    mapping_t *s = &n->slots[i];
    memset(s, 0, sizeof *s);
    s->vni = vni; s->ip = ip; s->port = port; s->proto = proto; s->eip = eip; s->eport = eport; s->used = 1;
    n->out_index[j] = (int32_t)i;
    n->nused++;
    return (int32_t)i;
}

int32_t nat_insert(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto, uint32_t eip, uint16_t eport,
                   double now) {
    if (n->nused >= n->cap / 4 * 3) return -1;  /* fuller, probe chains grow long */
    int32_t idx = place(n, vni, ip, port, proto, eip, eport);
    n->slots[idx].last = now;
    return idx;
}

/* every mapping into fresh slots: deletions leave tombstones, and a lookup that misses walks past them all */
static void rehash(nat_t *n) {
    mapping_t *old = n->slots, *fresh = calloc(n->cap, sizeof(mapping_t));
    if (!fresh) return;  /* still correct, only slower */
    n->slots = fresh;
    for (uint32_t i = 0; i < n->cap; i++) n->out_index[i] = -1;
    n->nused = n->ndel = 0;
    for (uint32_t i = 0; i < n->cap; i++) {
        if (old[i].used != 1) continue;
        mapping_t *s = &n->slots[place(n, old[i].vni, old[i].ip, old[i].port, old[i].proto, old[i].eip,
                                       old[i].eport)];
        *s = old[i];
    }
    free(old);
}

void nat_hold_port(nat_t *n, uint32_t eip, uint16_t eport, uint8_t proto, double until);

static int del_(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto, double hold_until) {
    int32_t idx = nat_find_in(n, vni, ip, port, proto);
    if (idx < 0) return -1;
    mapping_t *s = &n->slots[idx];
    uint32_t m = n->cap - 1, j = h_out(s->eip, s->eport, proto) & m;
    for (uint32_t k = 0; k < n->cap; k++, j = (j + 1) & m)
        if (n->out_index[j] == idx) { n->out_index[j] = -2; break; }
    if (hold_until > 0) nat_hold_port(n, s->eip, s->eport, proto, hold_until);
    nat_port_freed(n, s->eip, proto);
    s->used = 2; /* tombstone keeps probe chains intact */
    n->nused--;
    if (++n->ndel > n->cap / 4) rehash(n);
    return 0;
}

/* insert or update a mapping (Python's view of it); 0, or -1 when the table is full */
static int put_(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto, uint32_t eip, uint16_t eport,
                uint8_t established, uint8_t closing, const uint32_t *peer_ip, const uint16_t *peer_port,
                uint8_t npeers, double last) {
    int32_t idx = nat_find_in(n, vni, ip, port, proto);
    if (idx >= 0 && (n->slots[idx].eip != eip || n->slots[idx].eport != eport)) {
        del_(n, vni, ip, port, proto, 0);  /* a different mapping under the same inside key: start clean */
        idx = -1;
    }
    if (idx < 0 && (idx = nat_insert(n, vni, ip, port, proto, eip, eport, 0)) < 0) return -1;
    mapping_t *s = &n->slots[idx];
    /* the loop may have moved this mapping on since Python last looked: merge, never step back */
    s->established |= established; s->closing |= closing;
    if (last > s->last) s->last = last;
    s->npeers = npeers > NAT_MAX_PEERS ? NAT_MAX_PEERS : npeers;
    for (uint8_t p = 0; p < s->npeers; p++) { s->peer_ip[p] = peer_ip[p]; s->peer_port[p] = peer_port[p]; }
    return 0;
}

/* last-seen time and TCP state bits (1 established, 2 closing); -1.0 when there is no such mapping */
static double state_(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto, uint8_t *bits) {
    int32_t idx = nat_find_in(n, vni, ip, port, proto);
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
int nat_del(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto, double hold_until) {
    LOCKED(n, del_(n, vni, ip, port, proto, hold_until));
}
uint32_t nat_count(nat_t *n) { LOCKED(n, n->nused); }

int nat_has_peer(const mapping_t *s, uint32_t ip, uint16_t port) {
    for (uint8_t p = 0; p < s->npeers; p++) if (s->peer_ip[p] == ip && s->peer_port[p] == port) return 1;
    return 0;
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
    if (!nat_has_peer(s, ip.dst, peer_port) && nat_add_peer(n, s, ip.dst, peer_port, now)) goto miss;
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
    out5[0] = n->hits_out; out5[1] = n->hits_in; out5[2] = n->misses; out5[3] = n->created; out5[4] = n->events_full;
}
