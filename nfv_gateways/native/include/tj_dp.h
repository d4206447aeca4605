/* The gateway data plane: the packet loop of a gateway instance, in C, in bursts. This is its interface (Python
 * reads it: nfv_gateways/native/api.py); the loop's insides are tj_loop.h.
 *
 * Two ports: DP_UL (the underlay, where vSwitches send tenant traffic in VXLAN to our VTEP) and DP_EXT (the
 * external segment). For every received burst the loop hands each frame to the role's stage (NAT: dp_nat.c, load
 * balancer: dp_lb.c, private line: dp_line.c), transmits what it rewrote on the port the stage chose, and punts, untouched, whatever the
 * stage is not sure about (ARP, unknown neighbours, ICMP errors...) to a ring that Python drains (`dp_punt`);
 * Python's answers come back through `dp_inject`. Its configuration is per VPC (dp_set_vpc, dp_set_lb_vpc): a
 * change to one tenant crosses into C as that tenant's records. */
#ifndef TJ_DP_H
#define TJ_DP_H
#include <stdint.h>

#include "tj_api.h"
#include "tj_lb.h"
#include "tj_line.h"
#include "tj_nat.h"
#include "tj_svc.h"

typedef struct dp dp_t;

/* an address of a VPC and where it lives: its host's VTEP and its MAC (dp_set_vpc) */
typedef struct { uint32_t ip, vtep; uint8_t mac[6], pad[2]; } tj_endpoint_t;
/* a listener of a VPC's load balancer (dp_set_lb_vpc): VIP:port -> pool; eip: the VIP's EIP homed here, or 0 */
typedef struct { uint32_t vip, eip, pool; uint16_t port; uint8_t is_udp, src_only; } tj_lb_listener_t;
/* a member (its instance-wide number) and its address in the VPC */
typedef struct { uint32_t id, ip; } tj_lb_member_t;

/* --- the API Python calls --- */
/* a data plane with no stage yet: every frame is punted until a role hands it one (dp_use_nat, dp_use_lb) */
TJ_API dp_t *dp_create(const uint8_t *ul_mac, const uint8_t *ext_mac, uint32_t vtep_ip);
TJ_API const char *dp_error(dp_t *dp);
/* before dp_open, for a stage that keeps no state per flow (the line): the XDP cache's maps (xdp backend) are LRUs of
 * `entries` each, the kernel ageing flows out (default 0: hashes whose entries the stage takes back itself) */
TJ_API void dp_set_cache_lru(dp_t *dp, uint32_t entries);
/* backend: "packet", "mem", "xdp" or "dpdk"; for dpdk, `arg` is the EAL argument string; for xdp, the flow cache's
 * object file (empty: none) */
TJ_API int dp_open(dp_t *dp, const char *backend, const char *ul, const char *ext, const char *arg);
/* start the loop, on core `cpu` alone if cpu >= 0 (a DPDK worker lcore has the core EAL gave it) */
TJ_API int dp_start(dp_t *dp, int cpu);
TJ_API void dp_stop(dp_t *dp);
/* stops the loop and closes the ports; the struct itself stays valid (other Python threads may hold it) */
TJ_API void dp_close(dp_t *dp);
/* wait up to timeout_ms for punted frames; copies up to max into bufs (DP_SLOT bytes each) */
TJ_API int dp_punt(dp_t *dp, uint8_t *bufs, uint32_t *lens, uint8_t *ports, uint32_t max, int timeout_ms);
TJ_API int dp_inject(dp_t *dp, uint8_t port, const uint8_t *data, uint32_t len);
/* the VTEPs tenant traffic may come from, replaced whole (one per hypervisor: they change when hosts do) */
TJ_API int dp_set_vteps(dp_t *dp, const uint32_t *vteps, uint32_t n);
/* add or replace one VPC's forwarding: its router MAC and its endpoints (where each address lives), under the
 * lock (a burst never sees half of it); 0, or -1 out of memory (the VPC's old forwarding stays) */
TJ_API int dp_set_vpc(dp_t *dp, uint32_t vni, const uint8_t *router_mac, const tj_endpoint_t *eps, uint32_t n);
/* the VPC gone: 0, or -1 when there was none */
TJ_API int dp_remove_vpc(dp_t *dp, uint32_t vni);
/* how many VPCs and endpoints the data plane holds */
TJ_API uint32_t dp_vpc_count(dp_t *dp);
TJ_API uint32_t dp_endpoint_count(dp_t *dp);
TJ_API int dp_set_neigh(dp_t *dp, uint8_t port, uint32_t ip, const uint8_t *mac);
/* the external side's subnet (net/len) and its router: destinations off the subnet go to the router's MAC
 * (gw 0: every destination on-link, a flat segment) */
TJ_API void dp_set_ext_route(dp_t *dp, uint32_t net, uint32_t len, uint32_t gw);
/* the NAT stage over table `nat` (nat_outbound, nat_inbound), shared with Python's slow path */
TJ_API void dp_use_nat(dp_t *dp, nat_t *nat);
/* the load-balancer stage: new connections and established ones decided by `lb` (lb_pick) */
TJ_API void dp_use_lb(dp_t *dp, lb_t *lb);
/* one VPC's load balancing, replaced alone: its listeners (VIP, protocol, port) -> pool, and its members ->
 * address, what the stage forwards to; 0, or -1 out of memory (the VPC's old listeners stay) */
TJ_API int dp_set_lb_vpc(dp_t *dp, uint32_t vni, const tj_lb_listener_t *l, uint32_t nl, const tj_lb_member_t *m,
                         uint32_t nm);
/* the VPC's listeners and members gone: 0, or -1 when it had none */
TJ_API int dp_remove_lb_vpc(dp_t *dp, uint32_t vni);
/* the private line's stage (tj_line.h); `handoff_mtu`: the customers' side */
TJ_API void dp_use_line(dp_t *dp, uint32_t handoff_mtu);
/* a line added or replaced (by its VLAN), or gone; 0, or -1 out of memory / no such line */
TJ_API int dp_set_line(dp_t *dp, const tj_line_t *line);
TJ_API int dp_remove_line(dp_t *dp, uint16_t vlan);
/* a VNI's routes to its lines, replaced whole (n = 0: none); 0, or -1 out of memory (the old routes stay) */
TJ_API int dp_set_line_routes(dp_t *dp, uint32_t vni, const tj_line_route_t *routes, uint32_t n);
/* a customer router's MAC on a VLAN (learned from its ARP by Python) */
TJ_API int dp_set_line_neigh(dp_t *dp, uint16_t vlan, uint32_t ip, const uint8_t *mac);
/* the service endpoint's stage (tj_svc.h), and its connections' idle timeouts (TCP established, TCP opening or
 * closing, UDP) */
TJ_API void dp_use_svc(dp_t *dp);
TJ_API void dp_svc_set_timeouts(dp_t *dp, double established, double transitory, double udp);
/* a connection added: 0; TJ_SVC_OUT_TAKEN when its outside key is (another source port, then); TJ_SVC_IN_TAKEN
 * when its inside key is (a hash twin: Python keeps it); -1 out of memory */
TJ_API int dp_svc_add(dp_t *dp, const tj_svc_conn_t *conn);
/* the connection under an inside key, or an outside key, copied to *out (its last packet read from the XDP cache
 * too); 0, or -1 when there is none */
TJ_API int dp_svc_get_in(dp_t *dp, uint32_t vni, uint32_t vm, uint16_t vm_port, uint8_t proto, uint32_t ep_ip,
                         uint16_t port, tj_svc_conn_t *out);
TJ_API int dp_svc_get_out(dp_t *dp, uint32_t via_vni, uint8_t proto, uint32_t svc, uint16_t port, uint32_t source,
                          uint16_t sport, tj_svc_conn_t *out);
/* what Python saw of a connection it read (last packet, state), merged: never back; 0, or -1 when it is gone */
TJ_API int dp_svc_put(dp_t *dp, const tj_svc_conn_t *conn);
/* a connection removed (its cached flows too); 0, or -1 when C did not hold it */
TJ_API int dp_svc_del(dp_t *dp, const tj_svc_conn_t *conn);
/* up to max connections (of VPC vni; all when all), from *cursor on, which moves past them: call again until it
 * returns fewer than max */
TJ_API uint32_t dp_svc_list(dp_t *dp, uint32_t vni, uint8_t all, tj_svc_conn_t *out, uint32_t max,
                            uint32_t *cursor);
/* the connections idle past their timeout at `now` removed; how many */
TJ_API uint32_t dp_svc_expire(dp_t *dp, double now);
TJ_API uint32_t dp_svc_count(dp_t *dp);
TJ_API void dp_stats(dp_t *dp, uint64_t *out);
TJ_API uint32_t dp_nstats(void);
TJ_API const char *dp_counter_name(uint32_t i);
/* what the data plane holds, read back (tests): the endpoint (vni, ip) into *out (1), or 0; the pool << 1 | hashes
 * on the source alone, plus 1, of a listener, or 0 */
TJ_API int dp_get_endpoint(dp_t *dp, uint32_t vni, uint32_t ip, tj_endpoint_t *out);
TJ_API uint64_t dp_get_listener(dp_t *dp, uint32_t vni, uint32_t vip, uint8_t is_udp, uint16_t port);
/* the memory backend (tests): push a frame, run one poll, pop what was transmitted */
TJ_API int dp_mem_push(dp_t *dp, uint8_t port, const uint8_t *data, uint32_t len);
TJ_API int dp_poll(dp_t *dp);
TJ_API int dp_mem_pop(dp_t *dp, uint8_t *bufs, uint32_t *lens, uint8_t *ports, uint32_t max);
/* the XDP flow cache (tj_xdp.h) under test: the i-th flow a stage handed the memory backend (its port, key and
 * action copied out; 0, or -1 past the last); how many packets a connection's direction carries in C before it is
 * handed over (default 8); and (-1 in a library built without XDP) the cache's program from `obj` run once on a frame with that
 * one flow in its map: the XDP action (XDP_PASS: to the loop), the frame as it left in out (*out_len: its room) */
TJ_API int dp_mem_flow(dp_t *dp, uint32_t i, uint8_t *port, void *key, void *act);
/* the i-th flow gone from the memory backend's map, as an LRU map ages one out (0, or -1 past the last) */
TJ_API int dp_mem_flow_forget(dp_t *dp, uint32_t i);
TJ_API void dp_set_cache_after(dp_t *dp, uint32_t n);
TJ_API int dp_xdp_test(const char *obj, uint8_t port, const void *key, const void *act, const uint8_t *in,
                       uint32_t len, uint8_t *out, uint32_t *out_len);
#endif
