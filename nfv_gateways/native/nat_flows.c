/* The flows' life in the NAT table (include/tj_nat.h): new mappings (the SNAT rules' EIP, the port allocator, held
 * TCP ports), their peers, Python's reads and updates, deletion and expiry. Every decision is
 * roles/nat/store.py's and reference.py's (DictStore, NatTable._pick_eip), step for step: the differential tests
 * hold the two to the same ports and tables. */
#include <stdlib.h>
#include <string.h>

#include "tj_nat_table.h"

static double as_double(uint64_t v) { double d; memcpy(&d, &v, 8); return d; }
static uint64_t as_bits(double d) { uint64_t v; memcpy(&v, &d, 8); return v; }
static uint64_t held_key(uint32_t eip, uint16_t eport, uint8_t proto) {
    return ((uint64_t)eip << 24 | (uint64_t)eport << 8 | proto) + 1;
}
static uint64_t slice_key(uint32_t eip, uint8_t proto) { return ((uint64_t)eip << 8 | proto) + 1; }

void nat_flows_init(nat_t *n) {
    n->port_lo = 1024; n->port_hi = 65535;
    n->timeout[0] = 300; n->timeout[1] = 7440; n->timeout[2] = 240; n->timeout[3] = 60;
    n->tcp_hold = 120;
}

void nat_flows_free(nat_t *n) {
    map_free(n->cursor); map_free(n->held); map_free(n->full);
    n->cursor = n->held = n->full = NULL;
}

void nat_set_ports(nat_t *n, uint32_t lo, uint32_t hi) {
    pthread_mutex_lock(&n->mu);
    n->port_lo = lo; n->port_hi = hi;
    map_free(n->full); n->full = NULL;  /* another slice: no slice is known full */
    pthread_mutex_unlock(&n->mu);
}

void nat_set_timeouts(nat_t *n, double udp, double tcp_established, double tcp_transitory, double icmp,
                      double tcp_hold) {
    pthread_mutex_lock(&n->mu);
    n->timeout[0] = udp; n->timeout[1] = tcp_established; n->timeout[2] = tcp_transitory; n->timeout[3] = icmp;
    n->tcp_hold = tcp_hold;
    pthread_mutex_unlock(&n->mu);
}

/* --- ports (DictStore._alloc_port) ------------------------------------------------------------------------- */
/* 1 if free; else 0, lowering *soonest to the time a held port frees */
static int port_free(nat_t *n, uint32_t eip, uint16_t p, uint8_t proto, double now, double *soonest) {
    uint64_t until;
    if (nat_find_out(n, eip, p, proto) >= 0) return 0;
    if (!n->held || !map_get(n->held, held_key(eip, p, proto), &until) || as_double(until) <= now) return 1;
    if (as_double(until) < *soonest) *soonest = as_double(until);
    return 0;
}

/* the internal port itself if free, else the next free one after the (EIP, protocol)'s cursor; -1: none. A slice
 * found full is remembered until a mapping of it is deleted or its first held port frees (`full`), so that new
 * flows beyond it cost a lookup, not a scan of 64,512 ports each, in the loop */
static int32_t alloc_port(nat_t *n, uint32_t eip, uint8_t proto, uint16_t want, double now) {
    int64_t lo = n->port_lo, hi = n->port_hi, size = hi - lo + 1;
    uint64_t ck = slice_key(eip, proto), start = (uint64_t)lo, full;
    double soonest = 1e300;
    if (n->full && map_get(n->full, ck, &full) && now < as_double(full)) return -1;
    if (want >= lo && want <= hi && port_free(n, eip, want, proto, now, &soonest)) return want;
    if (size <= 0) return -1;
    if (n->cursor) map_get(n->cursor, ck, &start);
    for (int64_t i = 0; i < size; i++) {
        int64_t p = lo + ((((int64_t)start - lo + i) % size) + size) % size;
        if (port_free(n, eip, (uint16_t)p, proto, now, &soonest)) {
            map_grow_put(&n->cursor, ck, (uint64_t)(lo + (p - lo + 1) % size));
            return (int32_t)p;
        }
    }
    map_grow_put(&n->full, ck, as_bits(soonest));
    return -1;
}

/* the EIP for an internal address: the first of its VPC's rules that covers it picks one (NatTable._pick_eip) */
static int pick_eip(const nat_t *n, uint32_t vni, uint32_t ip, uint32_t *eip) {
    const vpc_nat_t *v = nat_vpc(n, vni);
    for (uint32_t k = 0; v && k < v->nsnat; k++) {
        const tj_snat_rule_t *r = &v->snat[k];
        if ((ip & r->mask) == r->net && r->neips) {
            *eip = v->eips[r->first + ((uint64_t)ip * 2654435761ULL) % r->neips];
            return 1;
        }
    }
    return 0;
}

/* --- mappings ---------------------------------------------------------------------------------------------- */
int nat_add_peer(mapping_t *s, uint32_t peer_ip, uint16_t peer_port) {
    int full = s->npeers == NAT_MAX_PEERS;
    if (full) {  /* the oldest forgotten (store.add_peer) */
        memmove(s->peer_ip, s->peer_ip + 1, sizeof s->peer_ip[0] * (NAT_MAX_PEERS - 1));
        memmove(s->peer_port, s->peer_port + 1, sizeof s->peer_port[0] * (NAT_MAX_PEERS - 1));
        s->npeers--;
    }
    s->peer_ip[s->npeers] = peer_ip; s->peer_port[s->npeers] = peer_port; s->npeers++;
    return full;
}

int32_t nat_create_for(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto, uint32_t peer_ip,
                       uint16_t peer_port, double now) {
    uint32_t eip;
    if (!pick_eip(n, vni, ip, &eip)) return -1;
    int32_t eport = alloc_port(n, eip, proto, port, now);
    if (eport < 0) return -1;
    int32_t idx = nat_insert(n, vni, ip, port, proto, eip, (uint16_t)eport, now);
    if (idx < 0) return -1;
    nat_add_peer(&n->slots[idx], peer_ip, peer_port);
    n->created++;
    return idx;
}

static void delete_(nat_t *n, int32_t idx, double hold_until) {
    mapping_t *s = &n->slots[idx];
    if (hold_until > 0) map_grow_put(&n->held, held_key(s->eip, s->eport, s->proto), as_bits(hold_until));
    if (n->full) map_grow_put(&n->full, slice_key(s->eip, s->proto), 0);  /* its slice is not full any more */
    nat_remove(n, idx);
}

static int get_(nat_t *n, int32_t idx, tj_nat_mapping_t *out) {
    if (idx < 0) return -1;
    *out = n->slots[idx];
    return 0;
}
int nat_get_in(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto, tj_nat_mapping_t *out) {
    LOCKED(n, get_(n, nat_find_in(n, vni, ip, port, proto), out));
}
int nat_get_out(nat_t *n, uint32_t eip, uint16_t eport, uint8_t proto, tj_nat_mapping_t *out) {
    LOCKED(n, get_(n, nat_find_out(n, eip, eport, proto), out));
}

static int create_(nat_t *n, tj_nat_mapping_t *m, double now) {
    int32_t idx = nat_find_in(n, m->vni, m->ip, m->port, m->proto);
    if (idx >= 0) { *m = n->slots[idx]; return NAT_EXISTS; }
    int32_t eport = alloc_port(n, m->eip, m->proto, m->port, now);
    if (eport < 0) return NAT_NO_PORT;
    if ((idx = nat_insert(n, m->vni, m->ip, m->port, m->proto, m->eip, (uint16_t)eport, m->last)) < 0)
        return NAT_TABLE_FULL;
    mapping_t *s = &n->slots[idx];
    s->established = m->established; s->closing = m->closing;
    for (uint8_t p = 0; p < m->npeers && p < NAT_MAX_PEERS; p++) nat_add_peer(s, m->peer_ip[p], m->peer_port[p]);
    *m = *s;
    return 0;
}
int nat_create_mapping(nat_t *n, tj_nat_mapping_t *m, double now) { LOCKED(n, create_(n, m, now)); }

static int put_(nat_t *n, const tj_nat_mapping_t *m) {
    int32_t idx = nat_find_in(n, m->vni, m->ip, m->port, m->proto);
    if (idx < 0) return -1;
    mapping_t *s = &n->slots[idx];
    s->established |= m->established; s->closing |= m->closing;
    if (m->last > s->last) s->last = m->last;
    for (uint8_t p = 0; p < m->npeers && p < NAT_MAX_PEERS; p++)
        if (!nat_has_peer(s, m->peer_ip[p], m->peer_port[p])) nat_add_peer(s, m->peer_ip[p], m->peer_port[p]);
    return 0;
}
int nat_put(nat_t *n, const tj_nat_mapping_t *m) { LOCKED(n, put_(n, m)); }

static int del_(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto, double hold_until) {
    int32_t idx = nat_find_in(n, vni, ip, port, proto);
    if (idx < 0) return -1;
    delete_(n, idx, hold_until);
    nat_compact(n);
    return 0;
}
int nat_del(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto, double hold_until) {
    LOCKED(n, del_(n, vni, ip, port, proto, hold_until));
}

static uint32_t list_(nat_t *n, uint32_t vni, uint8_t all, tj_nat_mapping_t *out, uint32_t max, uint32_t *cursor) {
    uint32_t k = 0, i = *cursor;
    for (; i < n->cap && k < max; i++)
        if (n->slots[i].used == 1 && (all || n->slots[i].vni == vni)) out[k++] = n->slots[i];
    *cursor = i;
    return k;
}
uint32_t nat_list(nat_t *n, uint32_t vni, uint8_t all, tj_nat_mapping_t *out, uint32_t max, uint32_t *cursor) {
    LOCKED(n, list_(n, vni, all, out, max, cursor));
}

uint32_t nat_count(nat_t *n) { LOCKED(n, n->nused); }

/* --- expiry (DictStore.expire) ----------------------------------------------------------------------------- */
#define EXPIRE_CHUNK 16384  /* slots looked at per hold of the lock: the loop waits for one chunk, not the table */

static double timeout_of(const nat_t *n, const mapping_t *s) {
    if (s->proto == 6) return s->established && !s->closing ? n->timeout[1] : n->timeout[2];
    return s->proto == 17 ? n->timeout[0] : n->timeout[3];
}

static void prune_held(nat_t *n, double now) {
    map_t *old = n->held;
    n->held = NULL;
    for (uint32_t i = 0; old && i < old->cap; i++)
        if (old->keys[i] && as_double(old->vals[i]) > now) map_grow_put(&n->held, old->keys[i], old->vals[i]);
    map_free(old);
}

uint32_t nat_expire(nat_t *n, double now) {
    uint32_t gone = 0;
    /* slots do not move while the sweep runs (removals leave tombstones): the table is compacted at its end */
    for (uint32_t from = 0; from < n->cap; from += EXPIRE_CHUNK) {
        pthread_mutex_lock(&n->mu);
        for (uint32_t i = from; i < from + EXPIRE_CHUNK && i < n->cap; i++) {
            mapping_t *s = &n->slots[i];
            if (s->used != 1 || now - s->last <= timeout_of(n, s)) continue;
            delete_(n, (int32_t)i, s->proto == 6 ? s->last + n->tcp_hold : 0);
            gone++;
        }
        pthread_mutex_unlock(&n->mu);
    }
    pthread_mutex_lock(&n->mu);
    prune_held(n, now);
    nat_compact(n);
    pthread_mutex_unlock(&n->mu);
    return gone;
}
