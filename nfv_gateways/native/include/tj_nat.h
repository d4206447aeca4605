/* The NAT translation stage: a table of mappings (inside vni/ip/port/proto <-> eip/eport), 1:1 EIPs and DNAT
 * rules, translating packets byte for byte as nfv_gateways/roles/nat/reference.py does, and creating mappings for new flows.
 *
 * New flows: a packet out with no mapping gets one here when the reference would give it one (the VPC's SNAT
 * rules in their order, the paired EIP, port preservation, then the next free port after the per-(EIP, protocol)
 * cursor, TCP ports held after their mapping ended); a new peer of a mapping is recorded likewise. Each is logged
 * (nat_events) and Python's reference takes the log in before it decides anything, so it holds every mapping.
 * Python keeps the rest: configuration, the mappings its own slow path creates (through nat_reserve, so that
 * one allocator hands out every port), expiry (nat_idle finds the candidates, Python decides and deletes), and the
 * last-seen times and TCP state it reads back (established, closing: both only ever go from 0 to 1, so merging the
 * two views is an OR). Anything this stage is not sure about (no rule or no free port, a peer beyond
 * NAT_MAX_PEERS, hairpin, DNAT'd ports and their targets, ICMP errors, fragments, malformed headers, TTL about to
 * run out) returns NAT_MISS so Python decides: the C stage never disagrees with the reference, it only declines. */
#ifndef TJ_NAT_H
#define TJ_NAT_H
#include <stdint.h>

#include "tj_api.h"

typedef struct nat nat_t;

/* what the loop created since Python last looked (nat_events): a mapping with its first peer (kind 0), or a peer
 * an existing mapping sent to (kind 1); NAT_EVENT_SIZE bytes (fastpath.EVENT is the same record in Python) */
typedef struct {
    uint32_t vni, ip, eip, peer_ip;
    uint16_t port, eport, peer_port;
    uint8_t proto, kind;
    double now;
} nat_event_t;

TJ_API nat_t *nat_create(uint32_t cap_pow2);
TJ_API void nat_destroy(nat_t *n);
/* the MTU of VPCs whose policy names none: a bigger packet in is Python's (it cuts or refuses it) */
TJ_API void nat_set_mtu(nat_t *n, uint32_t mtu);
/* the internet side's MTU: a bigger packet out (from a VPC with a larger MTU) is Python's */
TJ_API void nat_set_external_mtu(nat_t *n, uint32_t mtu);

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
/* insert or update Python's view of a mapping; 0, or -1 when the table is full */
TJ_API int nat_put(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto, uint32_t eip, uint16_t eport,
                   uint8_t established, uint8_t closing, const uint32_t *peer_ip, const uint16_t *peer_port,
                   uint8_t npeers, double last);
/* remove a mapping; a TCP one's port is not handed out again before hold_until (0: at once) */
TJ_API int nat_del(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto, double hold_until);
/* the slice of the port range this instance owns */
TJ_API void nat_set_ports(nat_t *n, uint32_t lo, uint32_t hi);
/* Python's slow path creating a mapping its reference decided on (EIP *eip): the mapping already under that
 * inside key (its EIP at *eip), or a new one with a port from the slice; the public port, or -1 when the slice
 * has no free port, -2 when the table is full */
TJ_API int32_t nat_reserve(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto, uint32_t *eip,
                           double now);
/* up to max of the loop's events (nat_event_t records, oldest first) copied to out and forgotten; how many */
TJ_API uint32_t nat_events(nat_t *n, uint8_t *out, uint32_t max);
/* the inside keys of up to max mappings idle past their timeout as this table sees them (last seen, TCP
 * state); how many. Python decides (the reference's timeouts) and deletes. */
TJ_API uint32_t nat_idle(nat_t *n, double now, double udp, double tcp_established, double tcp_transitory,
                         double icmp, uint32_t *vni, uint32_t *ip, uint16_t *port, uint8_t *proto, uint32_t max);
/* forget held ports whose time has come */
TJ_API void nat_prune_held(nat_t *n, double now);
/* how many mappings the table holds */
TJ_API uint32_t nat_count(nat_t *n);
/* last-seen time and TCP state bits (1 established, 2 closing); -1.0 when there is no such mapping */
TJ_API double nat_state(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto, uint8_t *bits);
/* translate one packet in place (the IP header onwards): NAT_OUT / NAT_IN, or NAT_MISS untouched */
TJ_API int nat_outbound(nat_t *n, uint32_t vni, uint8_t *b, uint32_t len, double now);
TJ_API int nat_inbound(nat_t *n, uint8_t *b, uint32_t len, double now, uint32_t *out_vni, uint32_t *out_ip);
/* fast_out, fast_in, misses, created (by the loop), events_full (new flows left to Python: the log was full) */
TJ_API void nat_stats(nat_t *n, uint64_t *out5);

#endif
