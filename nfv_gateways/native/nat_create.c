/* New mappings in C: the SNAT rules, the port allocator, held TCP ports, the event log Python takes in, and the
 * idle sweep its expiry starts from. Every decision is roles/nat/reference.py's (NatTable._pick_eip, _alloc_port, expire), step for
 * step: the differential tests hold the two to the same ports and tables. */
#include <stdlib.h>
#include <string.h>

#include "tj_nat_table.h"

_Static_assert(sizeof(nat_event_t) == NAT_EVENT_SIZE, "nat_event_t is the record Python reads");

static double as_double(uint64_t v) { double d; memcpy(&d, &v, 8); return d; }
static uint64_t as_bits(double d) { uint64_t v; memcpy(&v, &d, 8); return v; }
static uint64_t held_key(uint32_t eip, uint16_t eport, uint8_t proto) {
    return ((uint64_t)eip << 24 | (uint64_t)eport << 8 | proto) + 1;
}

void nat_hold_port(nat_t *n, uint32_t eip, uint16_t eport, uint8_t proto, double until) {
    map_grow_put(&n->held, held_key(eip, eport, proto), as_bits(until));  /* out of memory: not held */
}

static void prune_held_(nat_t *n, double now) {
    map_t *old = n->held;
    n->held = NULL;
    for (uint32_t i = 0; old && i < old->cap; i++)
        if (old->keys[i] && as_double(old->vals[i]) > now) map_grow_put(&n->held, old->keys[i], old->vals[i]);
    map_free(old);
}
void nat_prune_held(nat_t *n, double now) { pthread_mutex_lock(&n->mu); prune_held_(n, now); pthread_mutex_unlock(&n->mu); }

/* --- SNAT rules (each VPC's, in its record: nat_vpcs.c) ---------------------------------------------------- */
void nat_snat_free(nat_t *n) {
    map_free(n->cursor); map_free(n->held); map_free(n->full);
    n->cursor = n->held = n->full = NULL;
}

void nat_set_ports(nat_t *n, uint32_t lo, uint32_t hi) {
    pthread_mutex_lock(&n->mu);
    n->port_lo = lo; n->port_hi = hi;
    map_free(n->full); n->full = NULL;  /* another slice: no slice is known full */
    pthread_mutex_unlock(&n->mu);
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

/* --- ports (NatTable._alloc_port) --------------------------------------------------------------------------- */
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
    uint64_t ck = ((uint64_t)eip << 8 | proto) + 1, start = (uint64_t)lo, full;
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

void nat_port_freed(nat_t *n, uint32_t eip, uint8_t proto) {
    if (n->full) map_grow_put(&n->full, ((uint64_t)eip << 8 | proto) + 1, 0);
}

/* --- the event log --------------------------------------------------------------------------------------- */
static void log_event(nat_t *n, const mapping_t *s, uint32_t peer_ip, uint16_t peer_port, uint8_t kind, double now) {
    nat_event_t *e = &n->events[(n->ev_head + n->ev_count++) % NAT_EVENTS];
    *e = (nat_event_t){s->vni, s->ip, s->eip, peer_ip, s->port, s->eport, peer_port, s->proto, kind, now};
}

int32_t nat_create_for(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto, uint32_t peer_ip,
                       uint16_t peer_port, double now) {
    uint32_t eip;
    if (n->ev_count >= NAT_EVENTS) { n->events_full++; return -1; }
    if (!pick_eip(n, vni, ip, &eip)) return -1;
    int32_t eport = alloc_port(n, eip, proto, port, now);
    if (eport < 0) return -1;
    int32_t idx = nat_insert(n, vni, ip, port, proto, eip, (uint16_t)eport, now);
    if (idx < 0) return -1;
    mapping_t *s = &n->slots[idx];
    s->peer_ip[0] = peer_ip; s->peer_port[0] = peer_port; s->npeers = 1;
    log_event(n, s, peer_ip, peer_port, 0, now);
    n->created++;
    return idx;
}

int nat_add_peer(nat_t *n, mapping_t *s, uint32_t peer_ip, uint16_t peer_port, double now) {
    if (s->npeers >= NAT_MAX_PEERS) return -1;
    if (n->ev_count >= NAT_EVENTS) { n->events_full++; return -1; }
    s->peer_ip[s->npeers] = peer_ip; s->peer_port[s->npeers] = peer_port; s->npeers++;
    log_event(n, s, peer_ip, peer_port, 1, now);
    return 0;
}

static uint32_t events_(nat_t *n, uint8_t *out, uint32_t max) {
    uint32_t k = 0;
    for (; k < max && n->ev_count; k++, n->ev_count--, n->ev_head = (n->ev_head + 1) % NAT_EVENTS)
        memcpy(out + (size_t)k * NAT_EVENT_SIZE, &n->events[n->ev_head], NAT_EVENT_SIZE);
    return k;
}
uint32_t nat_events(nat_t *n, uint8_t *out, uint32_t max) { LOCKED(n, events_(n, out, max)); }

static int32_t reserve_(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto, uint32_t *eip,
                        double now) {
    int32_t idx = nat_find_in(n, vni, ip, port, proto);
    if (idx >= 0) { *eip = n->slots[idx].eip; return n->slots[idx].eport; }
    int32_t eport = alloc_port(n, *eip, proto, port, now);
    if (eport < 0) return -1;
    return nat_insert(n, vni, ip, port, proto, *eip, (uint16_t)eport, now) < 0 ? -2 : eport;
}
int32_t nat_reserve(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto, uint32_t *eip, double now) {
    LOCKED(n, reserve_(n, vni, ip, port, proto, eip, now));
}

/* --- expiry: the candidates (NatTable._timeout) ------------------------------------------------------------ */
#define IDLE_CHUNK 16384  /* slots looked at per hold of the lock: the loop waits for one chunk, not the table */

static uint32_t idle_(nat_t *n, uint32_t from, uint32_t to, double now, const double t[4], uint32_t *vni,
                      uint32_t *ip, uint16_t *port, uint8_t *proto, uint32_t k, uint32_t max) {
    for (uint32_t i = from; i < to && i < n->cap && k < max; i++) {
        const mapping_t *s = &n->slots[i];
        if (s->used != 1) continue;
        double timeout = s->proto == 6 ? (s->established && !s->closing ? t[1] : t[2]) : s->proto == 17 ? t[0] : t[3];
        if (now - s->last > timeout) { vni[k] = s->vni; ip[k] = s->ip; port[k] = s->port; proto[k] = s->proto; k++; }
    }
    return k;
}
/* the loop only inserts (slots never move under it); Python, the only one to delete or rehash, is here */
uint32_t nat_idle(nat_t *n, double now, double udp, double tcp_established, double tcp_transitory, double icmp,
                  uint32_t *vni, uint32_t *ip, uint16_t *port, uint8_t *proto, uint32_t max) {
    const double t[4] = {udp, tcp_established, tcp_transitory, icmp};
    uint32_t k = 0;
    for (uint32_t from = 0; from < n->cap && k < max; from += IDLE_CHUNK) {
        pthread_mutex_lock(&n->mu);
        k = idle_(n, from, from + IDLE_CHUNK, now, t, vni, ip, port, proto, k, max);
        pthread_mutex_unlock(&n->mu);
    }
    return k;
}
