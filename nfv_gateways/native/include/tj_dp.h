/* The gateway data plane: the packet loop of a gateway instance, in C, in bursts.
 *
 * Two ports: DP_UL (the underlay, where vSwitches send tenant traffic in VXLAN to our VTEP) and DP_EXT (the
 * external segment). For every received burst the loop hands each frame to the instance's translation stage
 * (NAT: dp_nat.c), transmits what it rewrote on the port the stage chose, and punts, untouched, whatever the stage
 * is not sure about (ARP, new flows, unknown neighbours, ICMP errors...) to a ring that Python drains (`dp_punt`);
 * Python's answers come back through `dp_inject`. So Python sees only new flows and control traffic.
 *
 * Packet I/O backends, one file each, one library per backend (native/Makefile):
 *   io_packet.c  AF_PACKET sockets, recvmmsg/sendmmsg bursts (always available)
 *   io_xdp.c     AF_XDP sockets through libxdp (copy mode on veth)
 *   io_dpdk.c    DPDK ethdev (net_af_xdp / net_af_packet vdevs), the loop on a worker lcore
 *   io_mem.c     frames pushed and pulled by the caller (tests), in every library */
#ifndef TJ_DP_H
#define TJ_DP_H
#include <pthread.h>
#include <stdint.h>

#include "tj_api.h"
#include "tj_lb.h"
#include "tj_map.h"
#include "tj_nat.h"

#define HEADROOM 128        /* every backend leaves at least this much before a received frame */
#define ENCAP 50            /* outer Ethernet + IPv4 + UDP + VXLAN */
#define RING 4096           /* punt and inject ring slots */
#define VXLAN_PORT 4789
#define ACT_DROP -1
#define ACT_PUNT -2

/* the loop's counters, in this order; their names are exported as dp_counter_names */
#define TJ_DP_COUNTERS(X)                                                                                           \
    X(rx_ul) X(rx_ext) X(tx_ul) X(tx_ext) X(fast_out) X(fast_in) X(punt) X(punt_full) X(drop_unknown_vtep)          \
    X(drop_unknown_vni) X(drop_not_ipv4) X(drop_malformed) X(ignored) X(tx_err) X(inject) X(inject_full) X(bursts)  \
    X(lb_to_member) X(lb_no_member)
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
typedef struct dp dp_t;
typedef struct {
    int (*rx)(dp_t *, int port, uint8_t **data, uint32_t *len, uint32_t max);
    int (*tx)(dp_t *, int port, uint8_t **data, const uint32_t *len, uint32_t n);  /* returns frames sent */
    void (*rx_done)(dp_t *, int port, uint32_t n);
    void (*idle)(dp_t *);
    void (*close)(dp_t *);
    int (*start)(dp_t *);   /* runs dp_loop somewhere; NULL: on a thread of ours */
    void (*join)(dp_t *);   /* waits for that loop to end; NULL: joins our thread */
} backend_t;
int io_packet_open(dp_t *dp, const char *ul, const char *ext);
int io_mem_open(dp_t *dp);
int io_xdp_open(dp_t *dp, const char *ul, const char *ext);   /* only in builds with TJ_XDP */
int io_dpdk_open(dp_t *dp, const char *eal_args);            /* only in builds with TJ_DPDK */

/* --- a translation stage: decides one frame under the lock it holds over the burst --- */
typedef struct {
    void (*lock)(dp_t *);
    void (*unlock)(dp_t *);
    /* the output port (rewritten frame at *out, *out_len), ACT_PUNT or ACT_DROP */
    int (*decide)(dp_t *, int port, uint8_t *d, uint32_t len, double now, uint8_t **out, uint32_t *out_len);
} stage_t;
extern const stage_t STAGE_NAT;
extern const stage_t STAGE_LB;

/* the load balancer's lookups (dp_lb.c), swapped whole under the config lock */
typedef struct {
    map_t *vips;       /* (vni << 32 | VIP) + 1 -> the VIP's index */
    map_t *listeners;  /* (index << 24 | is_udp << 16 | port) + 1 -> pool << 1 | hashes on the source alone */
    map_t *members;    /* member + 1 -> (vni << 32 | member IP) + 1: its key in `endpoints` */
    map_t *eips;       /* EIP | 1 << 32 -> the index of the VIP it fronts (EIPs homed here) */
    uint64_t *vip;     /* index -> vni << 32 | VIP */
    uint32_t *eip;     /* index -> its EIP homed here, or 0 */
} lb_maps_t;

struct dp {
    const stage_t *stage;
    nat_t *nat;
    lb_t *lb;
    lb_maps_t lbm;
    const backend_t *be;
    void *bs;                                   /* backend state */
    uint8_t mac[2][6];
    uint32_t vtep_ip;
    map_t *vteps, *routers, *endpoints, *neigh[2];
    uint8_t (*ep_mac)[6];                       /* endpoints map to (vtep << 16 | index into ep_mac) */
    pthread_mutex_t cfg;                        /* config swaps vs bursts */
    ring_t punt, inject;
    int evfd;                                   /* wakes the loop when Python injects */
    volatile int running;
    uint32_t nidle;                             /* empty polls in a row (adaptive polling) */
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
void *dp_loop(void *arg);
int dp_poll_once(dp_t *dp);
void dp_wait(dp_t *dp, int fd0, int fd1);
/* write the outer Ethernet/IPv4/UDP/VXLAN header at o (ENCAP bytes before the inner frame of ilen bytes) */
void dp_vxlan_encap(dp_t *dp, uint8_t *o, uint64_t next_hop_mac, uint32_t vtep, uint32_t vni, uint32_t flow_hash,
                    uint32_t inner_len);

/* --- the API Python calls --- */
TJ_API dp_t *dp_create(nat_t *nat, const uint8_t *ul_mac, const uint8_t *ext_mac, uint32_t vtep_ip);
TJ_API const char *dp_error(dp_t *dp);
/* backend: "packet", "mem", "xdp" or "dpdk"; for dpdk, `arg` is the EAL argument string */
TJ_API int dp_open(dp_t *dp, const char *backend, const char *ul, const char *ext, const char *arg);
/* start the loop, on core `cpu` alone if cpu >= 0 (a DPDK worker lcore has the core EAL gave it) */
TJ_API int dp_start(dp_t *dp, int cpu);
TJ_API void dp_stop(dp_t *dp);
/* stops the loop and closes the ports; the struct itself stays valid (other Python threads may hold it) */
TJ_API void dp_close(dp_t *dp);
/* wait up to timeout_ms for punted frames; copies up to max into bufs (DP_SLOT bytes each) */
TJ_API int dp_punt(dp_t *dp, uint8_t *bufs, uint32_t *lens, uint8_t *ports, uint32_t max, int timeout_ms);
TJ_API int dp_inject(dp_t *dp, uint8_t port, const uint8_t *data, uint32_t len);
/* VTEPs, router MACs per VNI and endpoints, swapped whole under the lock (bursts never see half of it) */
TJ_API int dp_set_config(dp_t *dp, const uint32_t *vteps, uint32_t nvteps, const uint32_t *vnis,
                         const uint8_t *rmacs, uint32_t nvpcs, const uint32_t *ep_vni, const uint32_t *ep_ip,
                         const uint32_t *ep_vtep, const uint8_t *ep_mac, uint32_t nep);
TJ_API int dp_set_neigh(dp_t *dp, uint8_t port, uint32_t ip, const uint8_t *mac);
/* the load-balancer stage instead of NAT: new connections and established ones decided by `lb` (lb_pick) */
TJ_API void dp_use_lb(dp_t *dp, lb_t *lb);
/* listeners (VNI, VIP, is_udp, port) -> pool (and whether it hashes on the client's address alone; the VIP's EIP if
 * this instance homes it, else 0), and members -> (VNI, address): what the stage forwards to, replaced whole; 0,
 * or -1 out of memory */
TJ_API int dp_set_lb(dp_t *dp, const uint32_t *l_vni, const uint32_t *l_vip, const uint8_t *l_udp,
                     const uint16_t *l_port, const uint32_t *l_pool, const uint8_t *l_src_only,
                     const uint32_t *l_eip, uint32_t nl, const uint32_t *m_id, const uint32_t *m_vni,
                     const uint32_t *m_ip, uint32_t nm);
TJ_API void dp_stats(dp_t *dp, uint64_t *out);
TJ_API uint32_t dp_nstats(void);
TJ_API const char *dp_counter_name(uint32_t i);
/* the memory backend (tests): push a frame, run one poll, pop what was transmitted */
TJ_API int dp_mem_push(dp_t *dp, uint8_t port, const uint8_t *data, uint32_t len);
TJ_API int dp_poll(dp_t *dp);
TJ_API int dp_mem_pop(dp_t *dp, uint8_t *bufs, uint32_t *lens, uint8_t *ports, uint32_t max);
#endif
