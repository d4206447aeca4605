/* The service endpoint's stage: the established connections through an endpoint, in C. Python's reference
 * (nfv_gateways/roles/service/reference.py, ServiceTable) decides every new connection (admission, the source
 * port, PROXY v2) and hands C those it may carry alone (roles/service/native.py); C rewrites their packets both
 * ways and punts everything else, unchanged: new connections, TCP SYN/FIN/RST (Python keeps the connection's
 * state and timers), ICMP, fragments, what is bigger than the other side's MTU, TTL running out, unknown
 * neighbours and endpoints. A connection is handed over when the reference admits it (its first packet, the SYN);
 * from then on C carries its handshake and its end too, tracking its state as the reference does (established on
 * the VM's first ACK without SYN, closing on a FIN or RST either way) and telling the reference each change
 * (dp_svc_events, drained by its absorb()). */
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
    uint8_t proto, state;  /* state: TJ_SVC_ESTABLISHED | TJ_SVC_CLOSING, as the reference had it when handing over */
} tj_svc_conn_t;
#define TJ_SVC_ESTABLISHED 1
#define TJ_SVC_CLOSING 2

/* a connection's state changed in C: the connection as handed over, and its state now */
typedef struct {
    tj_svc_conn_t conn;
    uint8_t state, pad[3];
} tj_svc_event_t;
#endif
