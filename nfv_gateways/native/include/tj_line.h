/* The private line's stage: VXLAN in a VPC's VNI on the underlay, 802.1Q in the line's VLAN on the handoff (the
 * instance's external port), both ways. nfv_gateways/roles/line/reference.py (LineTable) is the same in Python; the
 * role keeps the policy there and hands C what packets need, per VLAN and per VNI (roles/line/native.py).
 *
 * From the underlay: the longest prefix of the VNI's routes gives the VLAN, the customer router (its MAC known) and
 * the frame leaves tagged. From the handoff: a tagged frame of a known VLAN, to our MAC, addressed inside the line's
 * VPC, TTL - 1, encapsulated to the endpoint's hypervisor. Everything else that is not a plain drop is punted to
 * Python unchanged: ARP, traffic to a session's own address (BGP, BFD, ping), TTL running out, packets bigger than
 * the other side's MTU (fragments or ICMP fragmentation needed), unknown neighbours and endpoints. */
#ifndef TJ_LINE_H
#define TJ_LINE_H
#include <stdint.h>

#include "tj_api.h"

#define TJ_LINE_SESSIONS 4  /* session addresses of one line the stage knows (two instances carry a line) */

/* a line, by its VLAN: the VPC it enters (VNI, CIDR, MTU) and its sessions' addresses on the cloud side */
typedef struct {
    uint32_t vni, vpc_net, vpc_len, mtu;
    uint32_t locals[TJ_LINE_SESSIONS];
    uint16_t vlan, nlocals;
} tj_line_t;
/* a route of a VNI to a line: its prefix, the line's VLAN and the customer router of the session */
typedef struct { uint32_t net, len, nexthop; uint16_t vlan, pad; } tj_line_route_t;
#endif
