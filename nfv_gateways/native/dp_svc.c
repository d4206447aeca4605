/* The service endpoint's stage of the packet loop (include/tj_svc.h): established connections through an endpoint,
 * both ways. Connections are keyed twice, as the reference keys them: from the VM (vni, VM address and port,
 * protocol, endpoint address and port) and from the service (via VNI, protocol, service address and port, source
 * and source port); a key is a 64-bit hash checked against the connection it finds. */
#include <string.h>
#include <time.h>

#include "tj_ip4.h"
#include "tj_loop.h"

#define SERVICE_MTU 1500  /* the service network's (the reference's SERVICE_MTU) */
#define TCP_FIN 0x01
#define TCP_SYN 0x02
#define TCP_RST 0x04
#define TCP_ACK 0x10
#define TCP_SYN_FIN_RST 0x07

/* a connection (its state and last packet as C tracks them), and the flows of it that the XDP cache carries (bit d
 * of `cached`: direction d, arriving on fport[d] with key fk[d]; direction 0 is to the service, 1 back to the VM) */
typedef struct {
    tj_svc_conn_t c;
    struct tj_flow_key fk[2]; uint8_t fport[2], cached, carried[2];
} svc_conn_t;

static void no_lock(dp_t *dp) { (void)dp; }

static uint64_t hkey(uint64_t a, uint64_t b) {
    uint64_t k = (uint64_t)mix(a ^ 0x9e3779b97f4a7c15ULL) << 32 | mix(b ^ (a >> 7));
    return k ? k : 1;  /* 0 is the map's empty slot */
}
static uint64_t key_in(uint32_t vni, uint32_t vm, uint16_t vm_port, uint8_t proto, uint32_t ep, uint16_t port) {
    return hkey((uint64_t)vni << 32 | vm, (uint64_t)ep << 32 | (uint64_t)vm_port << 16 | port | (uint64_t)proto << 60);
}
static uint64_t key_out(uint32_t via, uint8_t proto, uint32_t svc, uint16_t port, uint32_t src, uint16_t sport) {
    return hkey((uint64_t)via << 32 | svc, (uint64_t)src << 32 | (uint64_t)port << 16 | sport | (uint64_t)proto << 60);
}
static uint64_t conn_in(const tj_svc_conn_t *c) {
    return key_in(c->vni, c->vm, c->vm_port, c->proto, c->ep_ip, c->port);
}
static uint64_t conn_out(const tj_svc_conn_t *c) {
    return key_out(c->via_vni, c->proto, c->svc, c->port, c->source, c->sport);
}

static svc_conn_t *lookup_in(const dp_t *dp, uint32_t vni, uint32_t vm, uint16_t vm_port, uint8_t proto,
                             uint32_t ep_ip, uint16_t port) {
    uint64_t p;
    if (!map_get(dp->svc_in, key_in(vni, vm, vm_port, proto, ep_ip, port), &p)) return NULL;
    svc_conn_t *s = (svc_conn_t *)(uintptr_t)p;
    const tj_svc_conn_t *c = &s->c;
    return c->vni == vni && c->vm == vm && c->vm_port == vm_port && c->proto == proto && c->ep_ip == ep_ip &&
           c->port == port ? s : NULL;
}
static svc_conn_t *lookup_out(const dp_t *dp, uint32_t via, uint8_t proto, uint32_t svc, uint16_t port,
                              uint32_t source, uint16_t sport) {
    uint64_t p;
    if (!map_get(dp->svc_out, key_out(via, proto, svc, port, source, sport), &p)) return NULL;
    svc_conn_t *s = (svc_conn_t *)(uintptr_t)p;
    const tj_svc_conn_t *c = &s->c;
    return c->via_vni == via && c->proto == proto && c->svc == svc && c->port == port && c->source == source &&
           c->sport == sport ? s : NULL;
}
static svc_conn_t *find_in(const dp_t *dp, uint32_t vni, const ip4_t *ip, uint16_t sp, uint16_t dport) {
    return lookup_in(dp, vni, ip->src, sp, ip->proto, ip->dst, dport);
}
static svc_conn_t *find_out(const dp_t *dp, uint32_t via, const ip4_t *ip, uint16_t sp, uint16_t dport) {
    return lookup_out(dp, via, ip->proto, ip->src, sp, ip->dst, dport);
}

/* TCP or UDP, whole, not a fragment, TTL to spare: what C may carry; the ports into *sp, *dport, TCP's flags into
 * *flags (0 for UDP) */
static int plain(const uint8_t *b, const ip4_t *ip, uint16_t *sp, uint16_t *dport, uint8_t *flags) {
    uint8_t icmp;
    *flags = 0;
    if (ip->frag || (ip->proto != 6 && ip->proto != 17) || !ip4_ports(b, ip, sp, dport, &icmp) || b[8] <= 1)
        return 0;
    if (ip->proto == 6) {
        uint32_t doff = (uint32_t)(b[ip->l4 + 12] >> 4) * 4;
        if (doff < 20 || doff > ip->total - ip->l4) return 0;
        *flags = b[ip->l4 + 13];
    }
    return 1;
}

/* the connection's TCP state from a packet's flags, as the reference's ServiceTable._track */
static void track(svc_conn_t *s, uint8_t flags, int from_vm) {
    if (flags & (TCP_FIN | TCP_RST)) s->c.state |= TJ_SVC_CLOSING;
    else if (from_vm && (flags & TCP_ACK) && !(flags & TCP_SYN)) s->c.state |= TJ_SVC_ESTABLISHED;
}

/* --- the XDP flow cache (include/tj_xdp.h) --- */
/* the connection's packet that arrived on in_port with key k went out of out_port as the frame at o: the cache does
 * the same to the rest of that direction (packets up to `mtu`), once C has carried enough of it (carry() calls this
 * only where the backend has a cache that does not hold the direction yet) */
static void cache(dp_t *dp, svc_conn_t *s, int dir, int in_port, const struct tj_flow_key *k, int out_port,
                  const uint8_t *o, uint32_t mtu) {
    if (++s->carried[dir] < dp->cache_after) return;
    if (s->c.proto == 6 && !(s->c.state & TJ_SVC_ESTABLISHED)) return;  /* the establishing ACK must come through C */
    const uint8_t *ip = o + (out_port == DP_UL ? ENCAP : 0) + 14;
    if ((ip[0] & 0xf) != 5) return;  /* options: the program leaves those to us anyway */
    struct tj_flow_act a;
    dp_flow_act(dp, &a, in_port, out_port, o, mtu, TJ_XDP_NAT | TJ_XDP_TTL | TJ_XDP_TRIM);
    memcpy(&a.src, ip + 12, 4); memcpy(&a.dst, ip + 16, 4);
    memcpy(&a.sport, ip + 20, 2); memcpy(&a.dport, ip + 22, 2);
    if (dp->be->flow_put(dp, in_port, k, &a, out_port) == 0) {
        s->fk[dir] = *k; s->fport[dir] = (uint8_t)in_port; s->cached |= (uint8_t)(1 << dir);
    }
}

/* the connection's flows read back from the cache (and dropped from it if `drop`): s->c.last brought up to date */
static void cache_read(dp_t *dp, svc_conn_t *s, int drop) {
    if (!dp->be || !dp->be->flow_take) { s->cached = 0; return; }  /* closed: the cache went with the ports */
    struct timespec mono, wall;
    clock_gettime(CLOCK_MONOTONIC, &mono); clock_gettime(CLOCK_REALTIME, &wall);
    for (int d = 0; d < 2; d++) {
        uint64_t ns = 0;
        if (!(s->cached & 1 << d) || dp->be->flow_take(dp, s->fport[d], &s->fk[d], drop, &ns) || !ns) continue;
        double ago = ((double)mono.tv_sec * 1e9 + (double)mono.tv_nsec - (double)ns) * 1e-9;
        double at = (double)wall.tv_sec + (double)wall.tv_nsec * 1e-9 - ago;
        if (at > s->c.last) s->c.last = at;
    }
    if (drop) s->cached = 0;
}

static void uncache(dp_t *dp, uint32_t vni) {
    map_t *m = dp->svc_in;
    for (uint32_t i = 0; m && i < m->cap; i++) {
        svc_conn_t *s = (svc_conn_t *)(uintptr_t)m->vals[i];
        if (m->keys[i] && s->cached && (!vni || s->c.vni == vni || s->c.back_vni == vni || s->c.via_vni == vni))
            cache_read(dp, s, 1);
    }
}

/* a reply (the packet at pkt, ilen bytes) to the connection's VM: rewritten, encapsulated to its hypervisor; the
 * inner Ethernet header goes at e (14 bytes before pkt), the outer ENCAP bytes before that */
static int to_vm(dp_t *dp, svc_conn_t *s, uint8_t *pkt, const ip4_t *ip, double now, uint8_t **out, uint32_t *out_len) {
    const tj_svc_conn_t *c = &s->c;
    if (ip->total > c->mtu) return ACT_PUNT;  /* fragments or fragmentation needed: Python's */
    uint64_t rmac = 0, nh = 0;
    const tj_endpoint_t *ep = dp_endpoint(dp, c->back_vni, c->vm);
    if (!ep || !map_get(dp->routers, c->back_vni | 1ULL << 32, &rmac) ||
        !map_get(dp->neigh[DP_UL], ep->vtep | 1ULL << 32, &nh))
        return ACT_PUNT;
    ip4_dec_ttl(pkt);
    ip4_rewrite_addr(pkt, ip, 1, c->ep_ip);
    ip4_rewrite_addr(pkt, ip, 0, c->vm);
    ip4_rewrite_port(pkt, ip, 0, c->vm_port);
    s->c.last = now;
    uint8_t *e = pkt - 14;
    dp_encap_to(dp, e - ENCAP, e, ip->total + 14, ep->mac, rmac, nh, ep->vtep, c->back_vni);
    *out = e - ENCAP; *out_len = ENCAP + 14 + ip->total;
    dp->c[C_svc_in]++;
    return DP_UL;
}

/* a VM's packet of a connection: to the service, on the external side or into a published load balancer's VNI */
static int to_service(dp_t *dp, svc_conn_t *s, uint8_t *pkt, const ip4_t *ip, double now, uint8_t **out,
                      uint32_t *out_len) {
    const tj_svc_conn_t *c = &s->c;
    uint64_t mac = 0, rmac = 0, nh = 0;
    const tj_endpoint_t *ep = NULL;
    if (c->via_vni) {
        if (ip->total > c->mtu || !(ep = dp_endpoint(dp, c->via_vni, c->svc)) ||
            !map_get(dp->routers, c->via_vni | 1ULL << 32, &rmac) ||
            !map_get(dp->neigh[DP_UL], ep->vtep | 1ULL << 32, &nh)) return ACT_PUNT;
    } else if (ip->total > SERVICE_MTU || !map_get(dp->neigh[DP_EXT], dp_ext_hop(dp, c->svc) | 1ULL << 32, &mac)) {
        return ACT_PUNT;
    }
    ip4_dec_ttl(pkt);
    ip4_rewrite_addr(pkt, ip, 1, c->source);
    ip4_rewrite_addr(pkt, ip, 0, c->svc);
    ip4_rewrite_port(pkt, ip, 1, c->sport);
    s->c.last = now;
    uint8_t *e = pkt - 14;
    dp->c[C_svc_out]++;
    if (c->via_vni) {
        dp_encap_to(dp, e - ENCAP, e, ip->total + 14, ep->mac, rmac, nh, ep->vtep, c->via_vni);
        *out = e - ENCAP; *out_len = ENCAP + 14 + ip->total;
        return DP_UL;
    }
    mac_out(e, mac); memcpy(e + 6, dp->mac[DP_EXT], 6); wr16(e + 12, 0x0800);
    *out = e; *out_len = 14 + ip->total;
    return DP_EXT;
}

/* a packet of connection s carried (direction dir: 0 to the service, 1 back to the VM): rewritten, its TCP state
 * tracked, and its direction handed to the XDP cache when due, keyed as it arrived on in_port (outer vtep and vni) */
static int carry(dp_t *dp, svc_conn_t *s, int dir, int in_port, uint32_t vtep, uint32_t vni, uint8_t *pkt,
                 const ip4_t *ip, uint16_t sp, uint16_t dport, uint8_t flags, double now, uint8_t **out,
                 uint32_t *out_len) {
    struct tj_flow_key k;
    int may_cache = dp->be->flow_put && !(s->cached & 1 << dir) && !(flags & TCP_SYN_FIN_RST);
    if (may_cache) dp_flow_key(&k, vtep, vni, ip->src, ip->dst, sp, dport, ip->proto);  /* before its rewrite */
    int port = dir ? to_vm(dp, s, pkt, ip, now, out, out_len) : to_service(dp, s, pkt, ip, now, out, out_len);
    if (port < 0) return port;
    track(s, flags, !dir);
    if (may_cache) cache(dp, s, dir, in_port, &k, port, *out, dir || s->c.via_vni ? s->c.mtu : SERVICE_MTU);
    return port;
}

static int from_underlay(dp_t *dp, uint8_t *d, uint32_t len, double now, uint8_t **out, uint32_t *out_len) {
    uint32_t vni;
    int act = dp_vxlan_in(dp, d, len, &vni);
    if (act != 0) return act;
    uint8_t *pkt = d + ENCAP + 14;
    ip4_t ip;
    uint16_t sp, dport;
    if (!ip4_parse(pkt, len - ENCAP - 14, &ip)) { dp->c[C_drop_malformed]++; return ACT_DROP; }
    uint8_t flags;
    if (!plain(pkt, &ip, &sp, &dport, &flags)) return ACT_PUNT;
    svc_conn_t *s = find_in(dp, vni, &ip, sp, dport);
    int dir = 0;
    if (!s && (s = find_out(dp, vni, &ip, sp, dport))) dir = 1;
    if (!s) return ACT_PUNT;  /* a new connection, or nothing: the reference decides */
    return carry(dp, s, dir, DP_UL, rd32(d + 26), vni, pkt, &ip, sp, dport, flags, now, out, out_len);
}

static int from_external(dp_t *dp, uint8_t *d, uint32_t len, double now, uint8_t **out, uint32_t *out_len) {
    int act = dp_ipv4_for_us(dp, DP_EXT, d, len);
    if (act != 0) return act;
    uint8_t *pkt = d + 14;
    ip4_t ip;
    uint16_t sp, dport;
    if (!ip4_parse(pkt, len - 14, &ip)) { dp->c[C_drop_malformed]++; return ACT_DROP; }
    uint8_t flags;
    if (!plain(pkt, &ip, &sp, &dport, &flags)) return ACT_PUNT;
    svc_conn_t *s = find_out(dp, 0, &ip, sp, dport);
    return s ? carry(dp, s, 1, DP_EXT, 0, 0, pkt, &ip, sp, dport, flags, now, out, out_len) : ACT_PUNT;
}

static int decide(dp_t *dp, int port, uint8_t *d, uint32_t len, double now, uint8_t **out, uint32_t *out_len) {
    if (port == DP_EXT) return from_external(dp, d, len, now, out, out_len);
    int act = dp_ipv4_for_us(dp, port, d, len);
    return act != 0 ? act : from_underlay(dp, d, len, now, out, out_len);
}

const stage_t STAGE_SVC = {.lock = no_lock, .unlock = no_lock, .decide = decide, .uncache = uncache};

void dp_use_svc(dp_t *dp) {
    pthread_mutex_lock(&dp->cfg);
    dp->stage = &STAGE_SVC;
    if (!dp->svc_timeout[0]) { dp->svc_timeout[0] = 3600; dp->svc_timeout[1] = 120; dp->svc_timeout[2] = 120; }
    pthread_mutex_unlock(&dp->cfg);
}

void dp_svc_set_timeouts(dp_t *dp, double established, double transitory, double udp) {
    pthread_mutex_lock(&dp->cfg);
    dp->svc_timeout[0] = established; dp->svc_timeout[1] = transitory; dp->svc_timeout[2] = udp;
    pthread_mutex_unlock(&dp->cfg);
}

int dp_svc_add(dp_t *dp, const tj_svc_conn_t *conn) {
    svc_conn_t *s = calloc(1, sizeof *s);
    if (!s) return -1;
    s->c = *conn;
    uint64_t ki = conn_in(conn), ko = conn_out(conn), p;
    pthread_mutex_lock(&dp->cfg);
    int r = 0;
    if (map_get(dp->svc_out, ko, &p)) r = TJ_SVC_OUT_TAKEN;  /* taken, or a hash twin: another port either way */
    else if (map_get(dp->svc_in, ki, &p)) r = TJ_SVC_IN_TAKEN;  /* a hash twin of another connection's */
    else if (map_reserve(&dp->svc_in, 1) || map_reserve(&dp->svc_out, 1)) r = -1;
    else { map_put(dp->svc_in, ki, (uint64_t)(uintptr_t)s); map_put(dp->svc_out, ko, (uint64_t)(uintptr_t)s); }
    pthread_mutex_unlock(&dp->cfg);
    if (r) free(s);
    return r;
}

/* under dp->cfg: the connection's copy, its last packet read from the XDP cache first */
static int copy_out(dp_t *dp, svc_conn_t *s, tj_svc_conn_t *out) {
    if (!s) return -1;
    if (s->cached) cache_read(dp, s, 0);
    *out = s->c;
    return 0;
}

int dp_svc_get_in(dp_t *dp, uint32_t vni, uint32_t vm, uint16_t vm_port, uint8_t proto, uint32_t ep_ip,
                  uint16_t port, tj_svc_conn_t *out) {
    pthread_mutex_lock(&dp->cfg);
    int r = copy_out(dp, lookup_in(dp, vni, vm, vm_port, proto, ep_ip, port), out);
    pthread_mutex_unlock(&dp->cfg);
    return r;
}

int dp_svc_get_out(dp_t *dp, uint32_t via_vni, uint8_t proto, uint32_t svc, uint16_t port, uint32_t source,
                   uint16_t sport, tj_svc_conn_t *out) {
    pthread_mutex_lock(&dp->cfg);
    int r = copy_out(dp, lookup_out(dp, via_vni, proto, svc, port, source, sport), out);
    pthread_mutex_unlock(&dp->cfg);
    return r;
}

/* the connection itself, found by a record of it (under dp->cfg) */
static svc_conn_t *held(const dp_t *dp, const tj_svc_conn_t *c) {
    return lookup_in(dp, c->vni, c->vm, c->vm_port, c->proto, c->ep_ip, c->port);
}

int dp_svc_put(dp_t *dp, const tj_svc_conn_t *conn) {
    pthread_mutex_lock(&dp->cfg);
    svc_conn_t *s = held(dp, conn);
    if (s) {
        s->c.state |= conn->state;
        if (conn->last > s->c.last) s->c.last = conn->last;
    }
    pthread_mutex_unlock(&dp->cfg);
    return s ? 0 : -1;
}

/* under dp->cfg: out of both indexes, its cached flows dropped, freed */
static void remove_(dp_t *dp, svc_conn_t *s) {
    map_del(dp->svc_in, conn_in(&s->c));
    map_del(dp->svc_out, conn_out(&s->c));
    if (s->cached) cache_read(dp, s, 1);
    free(s);
}

int dp_svc_del(dp_t *dp, const tj_svc_conn_t *conn) {
    pthread_mutex_lock(&dp->cfg);
    svc_conn_t *s = held(dp, conn);
    if (s) remove_(dp, s);
    pthread_mutex_unlock(&dp->cfg);
    return s ? 0 : -1;
}

uint32_t dp_svc_list(dp_t *dp, uint32_t vni, uint8_t all, tj_svc_conn_t *out, uint32_t max, uint32_t *cursor) {
    pthread_mutex_lock(&dp->cfg);
    map_t *m = dp->svc_in;
    uint32_t k = 0, i = *cursor;
    for (; m && i < m->cap && k < max; i++) {
        svc_conn_t *s = (svc_conn_t *)(uintptr_t)m->vals[i];
        if (m->keys[i] && (all || s->c.vni == vni)) copy_out(dp, s, &out[k++]);
    }
    *cursor = m ? i : 0;
    pthread_mutex_unlock(&dp->cfg);
    return k;
}

/* the reference's timeout of a connection (ServiceTable's timeout_of) */
static double timeout_of(const dp_t *dp, const tj_svc_conn_t *c) {
    if (c->proto != 6) return dp->svc_timeout[2];
    return (c->state & TJ_SVC_ESTABLISHED) && !(c->state & TJ_SVC_CLOSING) ? dp->svc_timeout[0] : dp->svc_timeout[1];
}

uint32_t dp_svc_expire(dp_t *dp, double now) {
    pthread_mutex_lock(&dp->cfg);
    map_t *m = dp->svc_in;
    uint32_t gone = 0;
    for (uint32_t i = 0; m && i < m->cap; i++) {
        if (!m->keys[i]) continue;
        svc_conn_t *s = (svc_conn_t *)(uintptr_t)m->vals[i];
        if (now - s->c.last <= timeout_of(dp, &s->c)) continue;
        if (s->cached) cache_read(dp, s, 0);  /* carried by the XDP cache meanwhile? */
        if (now - s->c.last <= timeout_of(dp, &s->c)) continue;
        remove_(dp, s);
        gone++;
        i--;  /* the map may have moved another entry into this slot (backward-shift deletion) */
    }
    pthread_mutex_unlock(&dp->cfg);
    return gone;
}

uint32_t dp_svc_count(dp_t *dp) {
    pthread_mutex_lock(&dp->cfg);
    uint32_t n = dp->svc_in ? dp->svc_in->n : 0;
    pthread_mutex_unlock(&dp->cfg);
    return n;
}
