/* The NAT stage's table, shared by its two files (not an interface: Python sees tj_nat.h only).
 * nat_stage.c looks mappings up and translates; nat_create.c creates them (SNAT rules, the port allocator, held
 * ports), tells Python through the event log, and finds the idle ones for Python's expiry. */
#ifndef TJ_NAT_TABLE_H
#define TJ_NAT_TABLE_H
#include <pthread.h>

#include "tj_map.h"
#include "tj_nat.h"

typedef struct {
    uint32_t vni, ip, eip;
    uint16_t port, eport;
    uint8_t proto, used, established, closing, npeers;  /* used: 0 empty, 1 a mapping, 2 deleted (tombstone) */
    uint32_t peer_ip[NAT_MAX_PEERS];
    uint16_t peer_port[NAT_MAX_PEERS];
    double last;
} mapping_t;

typedef struct { uint32_t net, mask, first, neips; } snat_rule_t;

struct nat {
    uint32_t cap;            /* power of two */
    mapping_t *slots;        /* open addressing on the inside key */
    int32_t *out_index;      /* open addressing on the outside key -> slot, -1 empty, -2 deleted */
    uint32_t nused, ndel;    /* mappings; deletions since the last rehash (their tombstones) */
    uint64_t *st_in, *st_out;   /* 1:1 EIPs, sorted: (vni << 32 | ip) << 0 -> eip, eip -> (vni, ip) */
    uint64_t *st_in_val, *st_out_val;
    uint32_t nstatic;
    uint64_t *dnat_in, *dnat_out;  /* sorted keys of DNAT'd (eip, port, proto) and of their targets: Python's */
    uint32_t ndnat;
    uint32_t *served;
    uint32_t nserved;
    uint32_t mtu;            /* the VPCs': a bigger packet in is Python's (it fragments or refuses it) */
    uint64_t *mtu_vni, *mtu_val;   /* sorted: VPCs whose MTU is not `mtu` */
    uint32_t ext_mtu;        /* the internet side's */
    uint32_t nmtu;
    /* creating mappings (nat_create.c) */
    map_t *snat_by_vni;      /* vni | 1 << 32 -> first << 32 | count: the VPC's rules in `snat`, config order */
    snat_rule_t *snat;
    uint32_t *snat_eips;
    uint32_t port_lo, port_hi;
    map_t *cursor;           /* (eip << 8 | proto) + 1 -> where the next port search starts */
    uint32_t ncursor;
    map_t *held;             /* (eip << 24 | port << 8 | proto) + 1 -> until (double bits): a TCP port not free */
    uint32_t nheld;
    map_t *full;             /* (eip << 8 | proto) + 1 -> until (double bits): the slice was found full */
    uint32_t nfull;
    nat_event_t *events;     /* what the loop created, for Python: a ring of NAT_EVENTS */
    uint32_t ev_head, ev_count;
    uint64_t hits_out, hits_in, misses, created, events_full;
    pthread_mutex_t mu;      /* Python's table updates vs the packet loop's bursts */
};

static inline uint32_t h_in(uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto) {
    return mix(((uint64_t)vni << 40) ^ ((uint64_t)ip << 8) ^ ((uint64_t)port << 24) ^ proto);
}
static inline uint32_t h_out(uint32_t eip, uint16_t eport, uint8_t proto) {
    return mix(((uint64_t)eip << 24) ^ ((uint64_t)eport << 8) ^ proto ^ 0x9e3779b97f4a7c15ULL);
}

/* `return expr` under the table's lock */
#define LOCKED(n, expr) do { pthread_mutex_lock(&(n)->mu); __typeof__(expr) r_ = (expr); pthread_mutex_unlock(&(n)->mu); return r_; } while (0)

int32_t nat_find_in(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto);
int32_t nat_find_out(nat_t *n, uint32_t eip, uint16_t eport, uint8_t proto);
/* a new mapping's slot, filled with its keys and no peers; -1 when the table is full */
int32_t nat_insert(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto, uint32_t eip, uint16_t eport,
                   double now);
int nat_has_peer(const mapping_t *s, uint32_t ip, uint16_t port);
/* the loop's new mapping for a packet that has none (a rule covers it, a port is free, the log has room): its
 * slot, its first peer recorded and logged; -1 otherwise (Python decides, and counts why) */
int32_t nat_create_for(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto, uint32_t peer_ip,
                       uint16_t peer_port, double now);
/* a peer the mapping has not sent to yet, added and logged; 0, or -1 (no room: Python decides) */
int nat_add_peer(nat_t *n, mapping_t *s, uint32_t peer_ip, uint16_t peer_port, double now);
void nat_snat_free(nat_t *n);
/* a mapping of (eip, proto) was deleted: its slice is not full any more */
void nat_port_freed(nat_t *n, uint32_t eip, uint8_t proto);
#endif
