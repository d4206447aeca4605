/* The NAT translation stage: the table of mappings (inside vni/ip/port/proto <-> eip/eport), 1:1 EIPs and DNAT
 * rules, translating packets byte for byte as nfv_gateways/roles/nat/reference.py does, and creating mappings for
 * new flows.
 *
 * The mappings have one owner: this table. Python's reference decides what C declines over the same table through
 * the calls below (nat_get_in, nat_get_out, nat_create_mapping, nat_put, nat_del, nat_list: its FlowStore,
 * roles/nat/store.py), and expiry is C's (nat_expire, by the timeouts nat_set_timeouts pushed down). New flows: a
 * packet out with no mapping gets one here when the reference would give it one (the VPC's SNAT rules in their
 * order, the paired EIP, port preservation, then the next free port after the per-(EIP, protocol) cursor, TCP
 * ports held after their mapping ended). Anything this stage is not sure about (no rule or no free port, a full
 * table, hairpin, DNAT'd ports and their targets, ICMP errors, fragments, malformed headers, TTL about to run
 * out, a packet over an MTU) returns NAT_MISS so Python decides: the C stage never disagrees with the reference,
 * it only declines.
 *
 * When there is no room (the one rule, the same in the reference's store): a full table (three quarters of its
 * slots) creates no mapping: the new flow's packet is dropped and counted `table_full`; a mapping remembers its
 * last NAT_MAX_PEERS remote endpoints: sending to one more forgets the oldest (counted `peers_replaced`), whose
 * packets are then filtered until the VM sends to it again. */
#ifndef TJ_NAT_H
#define TJ_NAT_H
#include <stdint.h>

#include "tj_api.h"

typedef struct nat nat_t;

/* one mapping as the table holds it and as it crosses to Python: its remote endpoints (the filter) oldest first */
typedef struct {
    uint32_t vni, ip, eip;
    uint16_t port, eport;
    uint8_t proto, established, closing, npeers;
    uint8_t used;                      /* the table's own: 1 for a mapping (0 an empty slot, 2 a deleted one) */
    uint32_t peer_ip[NAT_MAX_PEERS];
    uint16_t peer_port[NAT_MAX_PEERS];
    double last;                       /* the last packet's time */
} tj_nat_mapping_t;

TJ_API nat_t *nat_create(uint32_t cap_pow2);
TJ_API void nat_destroy(nat_t *n);
/* the MTU of VPCs whose policy names none: a bigger packet in is Python's (it cuts or refuses it) */
TJ_API void nat_set_mtu(nat_t *n, uint32_t mtu);
/* the internet side's MTU: a bigger packet out (from a VPC with a larger MTU) is Python's */
TJ_API void nat_set_external_mtu(nat_t *n, uint32_t mtu);
/* the slice of the port range this instance owns */
TJ_API void nat_set_ports(nat_t *n, uint32_t lo, uint32_t hi);
/* idle timeouts by protocol and TCP state, and how long a TCP port stays unused after its mapping ended */
TJ_API void nat_set_timeouts(nat_t *n, double udp, double tcp_established, double tcp_transitory, double icmp,
                             double tcp_hold);

/* One VPC's NAT policy, handed over whole for that VPC alone (nat_set_vpc): the C form of roles/nat/policy.py's
 * VpcNat. A change to one tenant crosses into C as that tenant's record, never as every tenant's rules. */
typedef struct { uint32_t net, mask, first, neips; } tj_snat_rule_t;  /* covers ip & mask == net; its EIPs are
                                                                         eips[first .. first + neips) */
typedef struct { uint32_t ip, eip; } tj_static_eip_t;                 /* 1:1: the VPC's ip <-> eip */
typedef struct { uint32_t eip, ip; uint16_t port, iport; uint8_t proto, pad[3]; } tj_dnat_rule_t;
                                                                      /* eip:port -> ip:iport (proto) */
typedef struct {
    uint32_t vni;
    uint32_t mtu;                      /* 0: nat_set_mtu's */
    uint32_t nsnat, neips, nstatic, ndnat;
    const tj_snat_rule_t *snat;        /* in config order: the first that covers an address picks its EIP */
    const uint32_t *eips;
    const tj_static_eip_t *statics;
    const tj_dnat_rule_t *dnat;
} tj_nat_vpc_t;
/* add or replace the policy of VPC vpc->vni (the EIPs it names are served here: a destination among them, seen
 * from inside, is a hairpin); 0, or -1 out of memory (the VPC's old policy stays) */
TJ_API int nat_set_vpc(nat_t *n, const tj_nat_vpc_t *vpc);
/* the VPC's policy gone (its mappings are Python's to delete); 0, or -1 when there was none */
TJ_API int nat_remove_vpc(nat_t *n, uint32_t vni);
/* how many VPCs' policies the table holds */
TJ_API uint32_t nat_vpc_count(nat_t *n);

/* --- the table, for Python's slow path (roles/nat/store.py's CStore) ------------------------------------- */
/* the mapping under an inside key, or an outside key, copied to *out; 0, or -1 when there is none */
TJ_API int nat_get_in(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto, tj_nat_mapping_t *out);
TJ_API int nat_get_out(nat_t *n, uint32_t eip, uint16_t eport, uint8_t proto, tj_nat_mapping_t *out);
/* a new mapping for m's inside key with EIP m->eip, its public port from the slice, its peers, TCP state and last
 * time as given in *m; *m gets the port. 0, or NAT_NO_PORT (the slice has none free), NAT_TABLE_FULL, or
 * NAT_EXISTS (the key has a mapping: *m is it) */
TJ_API int nat_create_mapping(nat_t *n, tj_nat_mapping_t *m, double now);
/* what Python's reference saw of a mapping it read (last time, new peers, TCP state), merged into the table's:
 * never back (times only forward, TCP bits only set, peers only added); 0, or -1 when there is no such mapping */
TJ_API int nat_put(nat_t *n, const tj_nat_mapping_t *m);
/* remove a mapping; a TCP one's port is not handed out again before hold_until (0: at once); 0, or -1 */
TJ_API int nat_del(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto, double hold_until);
/* up to max mappings (of VPC vni; every VPC's when all), from slot *cursor on, which moves past them: call
 * again until it returns fewer than max */
TJ_API uint32_t nat_list(nat_t *n, uint32_t vni, uint8_t all, tj_nat_mapping_t *out, uint32_t max,
                         uint32_t *cursor);
/* how many mappings the table holds */
TJ_API uint32_t nat_count(nat_t *n);
/* remove the mappings idle past their timeout at `now` (TCP ports held), and forget the held ports whose time
 * has come; how many mappings */
TJ_API uint32_t nat_expire(nat_t *n, double now);

/* translate one packet in place (the IP header onwards): NAT_OUT / NAT_IN, or NAT_MISS untouched */
TJ_API int nat_outbound(nat_t *n, uint32_t vni, uint8_t *b, uint32_t len, double now);
TJ_API int nat_inbound(nat_t *n, uint8_t *b, uint32_t len, double now, uint32_t *out_vni, uint32_t *out_ip);
/* fast_out, fast_in, misses (packets declined), created (mappings the loop made), peers_replaced (by the loop) */
TJ_API void nat_stats(nat_t *n, uint64_t *out5);

#endif
