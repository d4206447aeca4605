/* The service endpoint's stage: the established connections through an endpoint, in C. Python's reference
 * (nfv_gateways/roles/service/reference.py, ServiceTable) decides every new connection (admission, the source
 * port, PROXY v2) and hands C those it may carry alone (roles/service/native.py); C rewrites their packets both
 * ways and punts everything else, unchanged: new connections, TCP SYN/FIN/RST (Python keeps the connection's
 * state and timers), ICMP, fragments, what is bigger than the other side's MTU, TTL running out, unknown
 * neighbours and endpoints. */
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
    uint8_t proto, pad;
} tj_svc_conn_t;
#endif
