/* The packet loop's insides, shared by its C files (not an interface: Python reads tj_dp.h, never this).
 *
 * Packet I/O backends, one file each, one library per backend (native/Makefile):
 *   io_packet.c  AF_PACKET sockets, recvmmsg/sendmmsg bursts (always available)
 *   io_xdp.c     AF_XDP sockets through libxdp (copy mode on veth)
 *   io_dpdk.c    DPDK ethdev (net_af_xdp / net_af_packet vdevs), the loop on a worker lcore
 *   io_mem.c     frames pushed and pulled by the caller (tests), in every library */
#ifndef TJ_LOOP_H
#define TJ_LOOP_H
#include <pthread.h>
#include <stdint.h>

#include "tj_dp.h"
#include "tj_lb_table.h"
#include "tj_map.h"
#include "tj_nat_table.h"
#include "tj_xdp.h"

#define HEADROOM 128        /* every backend leaves at least this much before a received frame */
#define ENCAP 50            /* outer Ethernet + IPv4 + UDP + VXLAN */
#define RING 4096           /* punt and inject ring slots */
#define VXLAN_PORT 4789
#define ACT_DROP -1
#define ACT_PUNT -2

/* the loop's counters, in this order; their names are exported as dp_counter_names. busy_ns: time in polls that
 * moved frames (the loop's load: the rate it carries over busy_ns is its capacity, whatever the offered rate) */
#define TJ_DP_COUNTERS(X)                                                                                           \
    X(rx_ul) X(rx_ext) X(tx_ul) X(tx_ext) X(fast_out) X(fast_in) X(punt) X(punt_full) X(drop_unknown_vtep)          \
    X(drop_unknown_vni) X(drop_not_ipv4) X(drop_malformed) X(ignored) X(tx_err) X(inject) X(inject_full) X(bursts)  \
    X(lb_to_member) X(lb_no_member) X(line_out) X(line_in) X(drop_no_route) X(drop_untagged) X(drop_unknown_vlan)  \
    X(drop_not_in_vpc) X(svc_out) X(svc_in) X(busy_ns) X(xdp_carried)
#define TJ_COUNTER_ENUM(name) C_##name,
enum { TJ_DP_COUNTERS(TJ_COUNTER_ENUM) C_COUNT };

/* --- rings between the loop and Python (a mutex: hundreds of operations per second, not per packet) --- */
typedef struct { uint8_t port; uint16_t len; uint8_t data[DP_SLOT]; } slot_t;
typedef struct {
    slot_t *slots; uint32_t head, tail;  /* head: next to read, tail: next to write */
    pthread_mutex_t mu; pthread_cond_t cv;
} ring_t;
int ring_init(ring_t *r);
void ring_free(ring_t *r);
int ring_push(ring_t *r, uint8_t port, const uint8_t *d, uint32_t len);
/* copy up to max slots out (DP_SLOT bytes apart in bufs); the caller holds r->mu */
int ring_take(ring_t *r, uint8_t *bufs, uint32_t *lens, uint8_t *ports, uint32_t max);

/* --- a packet-I/O backend: one file each --- */
typedef struct {
    int (*rx)(dp_t *, int port, uint8_t **data, uint32_t *len, uint32_t max);
    int (*tx)(dp_t *, int port, uint8_t **data, const uint32_t *len, uint32_t n);  /* returns frames sent */
    void (*rx_done)(dp_t *, int port, uint32_t n);
    void (*idle)(dp_t *);
    void (*close)(dp_t *);
    int (*start)(dp_t *);   /* runs dp_loop somewhere; NULL: on a thread of ours */
    void (*join)(dp_t *);   /* waits for that loop to end; NULL: joins our thread */
    /* the XDP flow cache (tj_xdp.h), NULL where the backend has none: a flow arriving on `port` handed to it (0),
     * read (and removed) with when it last carried one, and how many frames it carried */
    int (*flow_put)(dp_t *, int port, const struct tj_flow_key *, struct tj_flow_act *, int out_port);
    int (*flow_take)(dp_t *, int port, const struct tj_flow_key *, int remove, uint64_t *last_ns);
    uint64_t (*flow_carried)(dp_t *);
    void (*flow_drop_all)(dp_t *);  /* every flow of both ports at once (a stateless stage's config changed) */
} backend_t;
int io_packet_open(dp_t *dp, const char *ul, const char *ext);
int io_mem_open(dp_t *dp);
int io_xdp_open(dp_t *dp, const char *ul, const char *ext, const char *cache);  /* only with TJ_XDP */
int io_dpdk_open(dp_t *dp, const char *eal_args);            /* only in builds with TJ_DPDK */

/* --- a translation stage: decides one frame under the lock it holds over the burst --- */
typedef struct {
    void (*lock)(dp_t *);
    void (*unlock)(dp_t *);
    /* the output port (rewritten frame at *out, *out_len), ACT_PUNT or ACT_DROP */
    int (*decide)(dp_t *, int port, uint8_t *d, uint32_t len, double now, uint8_t **out, uint32_t *out_len);
    /* under dp->cfg: the flows it handed the XDP cache that VPC `vni` (0: any config) may have changed, dropped */
    void (*uncache)(dp_t *, uint32_t vni);
} stage_t;
extern const stage_t STAGE_NAT;
extern const stage_t STAGE_LB;
extern const stage_t STAGE_LINE;
extern const stage_t STAGE_SVC;

/* the load balancer's lookups (dp_lb.c), per VPC: a VPC's listeners and members are replaced alone */
typedef struct {
    uint32_t vni, vip, eip;  /* eip: the VIP's EIP homed here, or 0 */
    map_t *listeners;        /* (is_udp << 16 | port) + 1 -> pool << 1 | hashes on the source alone */
} lb_vip_t;
typedef struct {
    uint32_t nvips, nmembers;
    lb_vip_t *vips;
    uint32_t *members;       /* the member ids it put in lb_maps_t.members */
} lb_vpc_t;
typedef struct {
    map_t *vpcs;             /* vni | 1 << 32 -> lb_vpc_t * */
    map_t *vips;             /* (vni << 32 | VIP) + 1 -> lb_vip_t * */
    map_t *eips;             /* EIP | 1 << 32 -> lb_vip_t * (of the VIP it fronts, homed here) */
    map_t *members;          /* member + 1 -> (vni << 32 | member IP) + 1: its key in `endpoints` */
} lb_maps_t;

/* the private line's lookups (dp_line.c) */
typedef struct { uint64_t lens; uint32_t n; tj_line_route_t *r; } line_vni_t;  /* lens: bit L set, a /L route */
typedef struct { struct tj_flow_key k; double at; } line_memo_t;  /* a flow handed the XDP cache, and when */
typedef struct {
    uint32_t handoff_mtu;
    map_t *lines;            /* vlan | 1 << 32 -> tj_line_t * */
    map_t *locals;           /* (vlan << 32 | a session's address) + 1 -> 1 */
    map_t *vnis;             /* vni | 1 << 32 -> line_vni_t * */
    map_t *routes;           /* (vni << 38 | len << 32 | net) + 1 -> tj_line_route_t * (in its line_vni_t) */
    map_t *neigh;            /* (vlan << 32 | IP) + 1 -> MAC */
    line_memo_t *memo;       /* the flows lately handed the XDP cache, by hash (dp_line.c) */
} line_maps_t;

/* a VPC's forwarding (dp_set_vpc): its endpoints, which `endpoints` points into */
typedef struct { uint32_t n; tj_endpoint_t *eps; } vpc_fwd_t;

struct dp {
    const stage_t *stage;
    nat_t *nat;
    lb_t *lb;
    lb_maps_t lbm;
    line_maps_t line;
    map_t *svc_in, *svc_out;                   /* the service stage's connections (dp_svc.c): hash -> svc_conn_t * */
    double svc_timeout[3];                     /* TCP established, TCP opening or closing, UDP (dp_svc.c) */
    const backend_t *be;
    void *bs;                                   /* backend state */
    uint8_t mac[2][6];
    uint32_t vtep_ip;
    uint32_t ext_net, ext_mask, ext_gw;         /* the external side's subnet and its router (0: all on-link) */
    map_t *vteps, *routers, *neigh[2];         /* VTEP | 1 << 32; vni | 1 << 32 -> router MAC; IP | 1 << 32 -> MAC */
    map_t *vpcs;                                /* vni | 1 << 32 -> vpc_fwd_t * */
    map_t *endpoints;                           /* (vni << 32 | IP) + 1 -> const tj_endpoint_t * (in its vpc_fwd_t) */
    pthread_mutex_t cfg;                        /* config swaps vs bursts */
    ring_t punt, inject;
    int evfd;                                   /* wakes the loop when Python injects */
    volatile int running;
    uint32_t nidle;                             /* empty polls in a row (adaptive polling) */
    uint32_t cache_after;                       /* a direction's packets in C before the XDP cache takes it */
    uint32_t cache_lru;                         /* > 0: the cache's maps are LRUs of that many (a stateless stage) */
    pthread_t thread;
    uint64_t c[C_COUNT];
    char err[256];
};

/* a frame for a stage: 0 for IPv4 to our MAC on `port`; ACT_PUNT for ARP; else ACT_DROP (counted) */
int dp_ipv4_for_us(dp_t *dp, int port, const uint8_t *d, uint32_t len);
/* a VXLAN frame from the underlay to our VTEP, from a known VTEP, in a known VNI, carrying IPv4: 0 with *vni set;
 * else ACT_PUNT (not VXLAN to us, outer fragments or bad sums: Python looks) or ACT_DROP (counted) */
int dp_vxlan_in(dp_t *dp, const uint8_t *d, uint32_t len, uint32_t *vni);
/* an inner IPv4 packet at e + 14 to an endpoint (MAC `mac` behind VTEP `vtep`, next hop `nh`): the inner Ethernet
 * header at e (from the VPC's router MAC), the outer VXLAN header at o (ENCAP bytes before e), in VNI `vni` */
void dp_encap_to(dp_t *dp, uint8_t *o, uint8_t *e, uint32_t elen, const uint8_t *mac, uint64_t rmac, uint64_t nh,
                 uint32_t vtep, uint32_t vni);
/* the outer UDP source port's entropy for an inner IPv4 packet (as Linux does; underlay.vxlan_ip_udp is the same) */
static inline uint32_t dp_flow_entropy(const uint8_t *ip) {
    return mix(rd32(ip + 12) ^ rd32(ip + 16) ^ (uint64_t)ip[9] << 32);
}
/* the XDP flow cache's key for a flow as it arrived (host order in): the outer VTEP and VNI (0 and TJ_XDP_VLAN | VLAN
 * for a tagged frame), the inner 5-tuple */
void dp_flow_key(struct tj_flow_key *k, uint32_t vtep, uint32_t vni, uint32_t src, uint32_t dst, uint16_t sport,
                 uint16_t dport, uint8_t proto);
/* the cache's action for a packet that arrived on in_port and left out_port as the frame at o: its new headers, the
 * MTU above which a packet is the loop's, and `flags` (TJ_XDP_NAT ...: a stage with NAT adds the new 5-tuple) */
void dp_flow_act(const dp_t *dp, struct tj_flow_act *a, int in_port, int out_port, const uint8_t *o, uint32_t mtu,
                 uint8_t flags);
void *dp_loop(void *arg);
int dp_poll_once(dp_t *dp);
void dp_wait(dp_t *dp, int fd0, int fd1);
/* write the outer Ethernet/IPv4/UDP/VXLAN header at o (ENCAP bytes before the inner frame of ilen bytes) */
void dp_vxlan_encap(dp_t *dp, uint8_t *o, uint64_t next_hop_mac, uint32_t vtep, uint32_t vni, uint32_t flow_hash,
                    uint32_t inner_len);
/* the external neighbour a packet to dst goes to: dst itself on the external subnet (or without a router), else
 * the router (an edge router that announces reach the EIPs by BGP) */
static inline uint32_t dp_ext_hop(const dp_t *dp, uint32_t dst) {
    return dp->ext_gw && (dst & dp->ext_mask) != dp->ext_net ? dp->ext_gw : dst;
}
/* the endpoint (vni, ip), or NULL */
static inline const tj_endpoint_t *dp_endpoint(const dp_t *dp, uint32_t vni, uint32_t ip) {
    uint64_t p;
    return map_get(dp->endpoints, ((uint64_t)vni << 32 | ip) + 1, &p) ? (const tj_endpoint_t *)(uintptr_t)p : NULL;
}
#endif

