/* The NAT stage's table, shared by its files (not an interface: Python sees tj_nat.h only). One concept per file,
 * each using only those above it in this list:
 *   nat_table.c   the mappings: open addressing on the inside key, an index on the outside key
 *   nat_vpcs.c    the VPCs' policies and the lookups across them
 *   nat_flows.c   the flows' life: new mappings (SNAT rules, the port allocator, held ports), peers, updates,
 *                 deletion and expiry; the table's calls for Python
 *   nat_stage.c   the packets: lookups and translation, the loop's new flows; the table made and freed */
#ifndef TJ_NAT_TABLE_H
#define TJ_NAT_TABLE_H
#include <pthread.h>

#include "tj_map.h"
#include "tj_nat.h"

typedef tj_nat_mapping_t mapping_t;

/* a VPC's policy as held: a copy of what nat_set_vpc was given (nat_vpcs.c) */
typedef struct {
    uint32_t vni, mtu, nsnat, neips, nstatic, ndnat;
    tj_snat_rule_t *snat;
    uint32_t *eips;
    tj_static_eip_t *statics;
    tj_dnat_rule_t *dnat;
} vpc_nat_t;

struct nat {
    uint32_t cap;            /* power of two */
    mapping_t *slots;        /* open addressing on the inside key */
    int32_t *out_index;      /* open addressing on the outside key -> slot, -1 empty, -2 deleted */
    uint32_t nused, ndel;    /* mappings; deletions since the last rehash (their tombstones) */
    /* the VPCs' policies (nat_vpcs.c), and what the packet path looks up across them, kept per VPC change */
    map_t *vpcs;             /* vni | 1 << 32 -> vpc_nat_t * */
    map_t *static_in;        /* TAG | vni << 32 | ip -> eip: 1:1 EIPs */
    map_t *static_out;       /* eip | 1 << 32 -> vni << 32 | ip */
    map_t *dnat_in;          /* TAG | eip << 24 | port << 8 | proto -> references: DNAT'd ports are Python's */
    map_t *dnat_out;         /* dnat_out_key(target) -> references: so are the replies of their targets */
    map_t *served;           /* eip | 1 << 32 -> references: the EIPs the VPCs name */
    uint32_t mtu;            /* of VPCs whose policy names none: a bigger packet in is Python's */
    uint32_t ext_mtu;        /* the internet side's */
    /* the flows' life (nat_flows.c) */
    uint32_t port_lo, port_hi;
    double timeout[4];       /* UDP, TCP established, TCP transitory, ICMP */
    double tcp_hold;         /* a TCP port unused this long after its mapping's last packet */
    map_t *cursor;           /* (eip << 8 | proto) + 1 -> where the next port search starts */
    map_t *held;             /* (eip << 24 | port << 8 | proto) + 1 -> until (double bits): a TCP port not free */
    map_t *full;             /* (eip << 8 | proto) + 1 -> until (double bits): the slice was found full */
    uint64_t hits_out, hits_in, misses, created, peers_replaced;
    pthread_mutex_t mu;      /* Python's calls vs the packet loop's bursts */
};

static inline uint32_t h_in(uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto) {
    return mix(((uint64_t)vni << 40) ^ ((uint64_t)ip << 8) ^ ((uint64_t)port << 24) ^ proto);
}
static inline uint32_t h_out(uint32_t eip, uint16_t eport, uint8_t proto) {
    return mix(((uint64_t)eip << 24) ^ ((uint64_t)eport << 8) ^ proto ^ 0x9e3779b97f4a7c15ULL);
}

#define TAG (1ULL << 63)  /* keys of vni << 32 | ip (or eip << 24 | ...) that could be 0 */

/* a DNAT target's key (a hash: a collision only sends a packet to Python, never translates it wrongly) */
static inline uint64_t dnat_out_key(uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto) {
    return (mix(((uint64_t)vni << 40) ^ ((uint64_t)ip << 8) ^ ((uint64_t)port << 24) ^ proto) |
            (uint64_t)mix((uint64_t)ip << 16 | port) << 32) | 1;
}

/* `return expr` under the table's lock */
#define LOCKED(n, expr) do { pthread_mutex_lock(&(n)->mu); __typeof__(expr) r_ = (expr); pthread_mutex_unlock(&(n)->mu); return r_; } while (0)

/* --- nat_table.c --------------------------------------------------------------------------------------- */
int nat_table_init(nat_t *n, uint32_t cap_pow2);
void nat_table_free(nat_t *n);
int32_t nat_find_in(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto);
int32_t nat_find_out(nat_t *n, uint32_t eip, uint16_t eport, uint8_t proto);
/* a new mapping's slot, filled with its keys and no peers; -1 when the table is full (three quarters used) */
int32_t nat_insert(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto, uint32_t eip, uint16_t eport,
                   double now);
/* the mapping in slot idx gone from both indexes (the caller holds its port: nat_flows.c); slots do not move */
void nat_remove(nat_t *n, int32_t idx);
/* after removals: the slots rehashed when tombstones are a quarter of them (slots move) */
void nat_compact(nat_t *n);
int nat_has_peer(const mapping_t *s, uint32_t ip, uint16_t port);

/* --- nat_vpcs.c ---------------------------------------------------------------------------------------- */
/* the policy of VPC vni, or NULL */
static inline const vpc_nat_t *nat_vpc(const nat_t *n, uint32_t vni) {
    uint64_t p;
    return map_get(n->vpcs, vni | 1ULL << 32, &p) ? (const vpc_nat_t *)(uintptr_t)p : NULL;
}
void nat_vpcs_free(nat_t *n);

/* --- nat_flows.c --------------------------------------------------------------------------------------- */
void nat_flows_init(nat_t *n);
void nat_flows_free(nat_t *n);
/* the loop's new mapping for a packet that has none (a rule covers it, a port is free, the table has room): its
 * slot, its first peer recorded; -1 otherwise (Python decides, and counts why) */
int32_t nat_create_for(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto, uint32_t peer_ip,
                       uint16_t peer_port, double now);
/* a remote endpoint the mapping sends to, remembered; 1 when the oldest was forgotten for it (NAT_MAX_PEERS) */
int nat_add_peer(mapping_t *s, uint32_t peer_ip, uint16_t peer_port);

/* --- nat_stage.c, for the packet loop, which holds the table's lock over a whole burst ------------------- */
void nat_lock(nat_t *n);
void nat_unlock(nat_t *n);
int nat_outbound_locked(nat_t *n, uint32_t vni, uint8_t *b, uint32_t len, double now);
int nat_inbound_locked(nat_t *n, uint8_t *b, uint32_t len, double now, uint32_t *out_vni, uint32_t *out_ip);
#endif
