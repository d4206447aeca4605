/* The XDP flow cache in front of the packet loop (tj_xdp.bpf.c): what the eBPF program and the loop share, Katran's
 * way. The loop decides the first packets of a flow; a stage that carries one (dp_svc.c a connection, dp_line.c a
 * line's flow) writes the exact rewrite it did into the ingress port's `flows` map, and the program repeats it on
 * every later packet, in the kernel, without the AF_XDP copies. Whatever the program is not sure of (no entry, TCP SYN/FIN/RST, fragments, IP
 * options, TTL running out, bigger than the entry's MTU, another MAC or VTEP) goes to the loop's AF_XDP socket as
 * before. Entries are a cache: the loop drops them when the config they were made from changes (or, all at once,
 * bumps the port's `epoch`: entries of an older one are misses). A stage with
 * connections takes each one back when its connection ends; for a stateless stage (the line) the map is an LRU
 * hash instead (set when the loop opens its ports), and the kernel evicts the flows least recently carried. */
#ifndef TJ_XDP_H
#define TJ_XDP_H
#include <linux/types.h>

#define TJ_XDP_FLOWS 262144   /* entries per port (allocated as they come: BPF_F_NO_PREALLOC) */
#define TJ_XDP_ENCAP 50       /* outer Ethernet + IPv4 + UDP + VXLAN (the loop's ENCAP) */
#define TJ_XDP_TAG 4          /* an 802.1Q tag */
#define TJ_XDP_VLAN (1u << 24) /* in a key's vni: the frame arrived tagged with this VLAN (no VXLAN) */

/* what the action does besides moving the packet (tj_flow_act.flags) */
#define TJ_XDP_NAT 1          /* new addresses and ports (and the L4 checksum) */
#define TJ_XDP_TTL 2          /* TTL - 1 (and the IPv4 checksum) */
#define TJ_XDP_TRIM 4         /* whatever follows the IPv4 packet in the frame is cut off (else kept, as the loop does) */
#define TJ_XDP_PUSH_TAG 8     /* the frame leaves tagged with `tci` */

/* a packet's flow as it arrives: outer source VTEP and VNI (0, 0 on a port without VXLAN; 0, TJ_XDP_VLAN | VLAN id
 * for a tagged frame), inner IPv4 5-tuple */
struct tj_flow_key {
    __u32 vtep, vni, src, dst;
    __u16 sport, dport;
    __u8 proto, pad[3];
};

/* what the loop did to that flow's packet, to be done again: */
struct tj_flow_act {
    __u8 flags;               /* TJ_XDP_NAT ... (a VXLAN port's frames are decapsulated: the program knows its port) */
    __u8 encap;               /* push `outer` (VXLAN out of the underlay port) */
    __u8 tx;                  /* out of the port it came in on (XDP_TX), else redirected to `ifindex` */
    __u8 pad;
    __u32 ifindex;
    __u32 expect_vtep;        /* the outer destination a decapsulated packet must have (ours) */
    __u32 mtu;                /* an inner IPv4 packet longer than this is the loop's (ICMP, fragments) */
    __u32 src, dst;           /* the inner packet's new addresses and ports (network order), with TJ_XDP_NAT */
    __u16 sport, dport;
    __u8 expect_mac[6];       /* the Ethernet destination it must have arrived with (our port's) */
    __u8 eth[12];             /* its new (inner) Ethernet destination and source */
    __u8 outer[TJ_XDP_ENCAP]; /* outer header with the lengths and IPv4 checksum to fill in */
    __u16 tci;                /* with TJ_XDP_PUSH_TAG: the tag's TCI (network order) */
    __u16 pad2;
    __u32 epoch;              /* the port's `epoch` when it was made: a stateless stage takes all back by a bump */
    __u64 last_ns;            /* written by the program: when it last carried one (CLOCK_MONOTONIC) */
};
#endif
