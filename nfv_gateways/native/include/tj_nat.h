/* The NAT translation stage: a table of mappings (inside vni/ip/port/proto <-> eip/eport), 1:1 EIPs and DNAT
 * rules, translating packets of established mappings byte for byte as nfv_gateways/nat.py does.
 *
 * Python owns everything else: it creates mappings (the slow path), pushes them here, expires them, and reads back
 * the last-seen times and TCP state (established, closing: both only ever go from 0 to 1, so merging the two views
 * is an OR). Anything this stage is not sure about (no mapping, new peer, hairpin, DNAT'd ports and their targets,
 * ICMP errors, fragments, malformed headers, TTL about to run out) returns NAT_MISS so Python decides: the C stage
 * never disagrees with the reference, it only declines. */
#ifndef TJ_NAT_H
#define TJ_NAT_H
#include <stdint.h>

#include "tj_api.h"

typedef struct nat nat_t;

TJ_API nat_t *nat_create(uint32_t cap_pow2);
TJ_API void nat_destroy(nat_t *n);
/* the VPCs' MTU (mtu), and the VPCs whose MTU differs (vnis[i] -> mtus[i]): a bigger packet in is Python's */
TJ_API void nat_set_mtu(nat_t *n, uint32_t mtu);
TJ_API int nat_set_vpc_mtus(nat_t *n, const uint32_t *vnis, const uint32_t *mtus, uint32_t count);
/* the internet side's MTU: a bigger packet out (from a VPC with a larger MTU) is Python's */
TJ_API void nat_set_external_mtu(nat_t *n, uint32_t mtu);
/* the EIPs this instance answers for (a destination among them, seen from inside, is a hairpin: Python's) */
TJ_API int nat_set_served(nat_t *n, const uint32_t *eips, uint32_t len);
/* 1:1 EIPs (vni, ip) <-> eip and DNAT rules (eip, port, proto) -> (vni, ip, port), replaced whole */
TJ_API int nat_set_rules(nat_t *n, const uint32_t *st_vni, const uint32_t *st_ip, const uint32_t *st_eip,
                         uint32_t nst, const uint32_t *d_eip, const uint16_t *d_port, const uint8_t *d_proto,
                         const uint32_t *d_vni, const uint32_t *d_ip, const uint16_t *d_iport, uint32_t nd);
/* insert or update Python's view of a mapping; 0, or -1 when the table is full */
TJ_API int nat_put(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto, uint32_t eip, uint16_t eport,
                   uint8_t established, uint8_t closing, const uint32_t *peer_ip, const uint16_t *peer_port,
                   uint8_t npeers, double last);
TJ_API int nat_del(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto);
/* last-seen time and TCP state bits (1 established, 2 closing); -1.0 when there is no such mapping */
TJ_API double nat_state(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto, uint8_t *bits);
/* translate one packet in place (the IP header onwards): NAT_OUT / NAT_IN, or NAT_MISS untouched */
TJ_API int nat_outbound(nat_t *n, uint32_t vni, uint8_t *b, uint32_t len, double now);
TJ_API int nat_inbound(nat_t *n, uint8_t *b, uint32_t len, double now, uint32_t *out_vni, uint32_t *out_ip);
/* fast_out, fast_in, misses */
TJ_API void nat_stats(nat_t *n, uint64_t *out3);

/* for the packet loop, which holds the table's lock over a whole burst */
void nat_lock(nat_t *n);
void nat_unlock(nat_t *n);
int nat_outbound_locked(nat_t *n, uint32_t vni, uint8_t *b, uint32_t len, double now);
int nat_inbound_locked(nat_t *n, uint8_t *b, uint32_t len, double now, uint32_t *out_vni, uint32_t *out_ip);
#endif
