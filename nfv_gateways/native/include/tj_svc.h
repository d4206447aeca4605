/* The service endpoint's stage: the connections through an endpoint that C carries, in C. Python's reference
 * (nfv_gateways/roles/service/reference.py, ServiceTable) decides every new connection (admission, the source
 * port, PROXY v2) and adds those C may carry alone (roles/service/conns.py, the native ConnStore): from then on the
 * connection is C's alone, its handshake and its end included: C tracks its state as the reference does
 * (established on the VM's first ACK without SYN, closing on a FIN or RST either way), its last packet (the XDP
 * flow cache's too), and expires it by the timeouts Python pushed down (dp_svc_set_timeouts). What C declines
 * (ICMP, fragments, what is bigger than the other side's MTU, TTL running out, unknown neighbours) Python decides
 * over the same connection: a lookup (dp_svc_get_in, dp_svc_get_out) and a write (dp_svc_put). PROXY v2
 * connections rewrite the stream: they are Python's alone and never here. */
#ifndef TJ_SVC_H
#define TJ_SVC_H
#include <stdint.h>

#include "tj_api.h"

/* a connection through an endpoint: the VM (vni, vm:vm_port) to the endpoint (ep_ip:port) leaves as
 * source:sport -> svc:port, on the external side (via_vni 0) or into VNI via_vni (a published load balancer's
 * VIP); what comes back goes to the VM in VNI back_vni (vni, or a peered VPC's whose VMs reach the endpoint);
 * what comes back bigger than `mtu` (the VPC's) is Python's */
typedef struct {
    uint32_t vni, vm, ep_ip, svc, source, via_vni, mtu, back_vni;
    uint16_t vm_port, port, sport;
    uint8_t proto, state;  /* state: TJ_SVC_ESTABLISHED | TJ_SVC_CLOSING */
    double last;           /* its last packet (wall-clock seconds) */
} tj_svc_conn_t;
#define TJ_SVC_ESTABLISHED 1
#define TJ_SVC_CLOSING 2
#endif
