/* Tianji gateway data plane: the packet loop of a NAT gateway instance, in C, in bursts.
 *
 * Two ports: UL (the underlay, where vSwitches send tenant traffic in VXLAN to our VTEP) and EXT (the external
 * segment). For every received burst the loop decapsulates, translates established flows with nat_fp.c, writes the
 * new headers in place (VXLAN encapsulation goes into the buffer's headroom) and transmits the burst on the other
 * port. Whatever it is not sure about (ARP, new flows, unknown neighbours, ICMP errors...) it punts, untouched, to a
 * ring that Python drains (`dp_punt`); Python's answers come back through `dp_inject`. So Python sees only new
 * flows and control traffic, never an established flow's packets.
 *
 * Packet I/O backends, one per build (the same source, chosen by -D):
 *   default      AF_PACKET sockets, recvmmsg/sendmmsg bursts (always available)
 *   TJ_XDP       AF_XDP sockets through libxdp (copy mode on veth)
 *   TJ_DPDK      DPDK ethdev (net_af_xdp / net_af_packet vdevs), the loop on a worker lcore
 */
#define _GNU_SOURCE
#include "nat_fp.c"

#include <arpa/inet.h>
#include <errno.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#define UL 0
#define EXT 1
#define BURST 64
#define HEADROOM 128        /* every backend leaves at least this much before a received frame */
#define ENCAP 50            /* outer Ethernet + IPv4 + UDP + VXLAN */
#define SLOT 2048
#define RING 4096           /* punt and inject ring slots */
#define VXLAN_PORT 4789
#define ACT_DROP -1
#define ACT_PUNT -2
#define PUNT_TRANSLATED 0x82 /* punt port code: an inbound packet already translated */

enum { C_RX_UL, C_RX_EXT, C_TX_UL, C_TX_EXT, C_FAST_OUT, C_FAST_IN, C_PUNT, C_PUNT_FULL, C_DROP_UNKNOWN_VTEP,
       C_DROP_UNKNOWN_VNI, C_DROP_NOT_IPV4, C_DROP_MALFORMED, C_IGNORED, C_TX_ERR, C_INJECT, C_INJECT_FULL,
       C_BURSTS, C_COUNT };

/* --- a small open-addressing map u64 -> u64 (key 0 is reserved: callers never use it) ------------------ */
typedef struct { uint32_t cap; uint64_t *keys, *vals; } map_t;

static map_t *map_new(uint32_t n) {
    uint32_t cap = 16;
    while (cap < n * 2 + 16) cap <<= 1;
    map_t *m = calloc(1, sizeof(map_t));
    if (!m) return NULL;
    m->cap = cap; m->keys = calloc(cap, 8); m->vals = calloc(cap, 8);
    if (!m->keys || !m->vals) { free(m->keys); free(m->vals); free(m); return NULL; }
    return m;
}
static void map_free(map_t *m) { if (m) { free(m->keys); free(m->vals); free(m); } }
static int map_put(map_t *m, uint64_t k, uint64_t v) {
    uint32_t i = mix(k) & (m->cap - 1);
    for (uint32_t n = 0; n < m->cap; n++, i = (i + 1) & (m->cap - 1))
        if (m->keys[i] == 0 || m->keys[i] == k) { m->keys[i] = k; m->vals[i] = v; return 0; }
    return -1;
}
static int map_get(const map_t *m, uint64_t k, uint64_t *v) {
    if (!m) return 0;
    uint32_t i = mix(k) & (m->cap - 1);
    for (uint32_t n = 0; n < m->cap; n++, i = (i + 1) & (m->cap - 1)) {
        if (m->keys[i] == k) { *v = m->vals[i]; return 1; }
        if (m->keys[i] == 0) return 0;
    }
    return 0;
}

/* --- rings between the loop and Python (mutex: a few hundred operations per second, not per packet) -------- */
typedef struct { uint8_t port; uint16_t len; uint8_t data[SLOT]; } slot_t;
typedef struct {
    slot_t *slots; uint32_t head, tail;  /* head: next to read, tail: next to write */
    pthread_mutex_t mu; pthread_cond_t cv;
} ring_t;

static int ring_init(ring_t *r) {
    r->slots = calloc(RING, sizeof(slot_t));
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    return r->slots ? 0 : -1;
}
static int ring_push(ring_t *r, uint8_t port, const uint8_t *d, uint32_t len) {
    if (len > SLOT) len = SLOT;
    pthread_mutex_lock(&r->mu);
    if (r->tail - r->head >= RING) { pthread_mutex_unlock(&r->mu); return -1; }
    slot_t *s = &r->slots[r->tail % RING];
    s->port = port; s->len = (uint16_t)len; memcpy(s->data, d, len);
    r->tail++;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return 0;
}

/* copy up to max slots out (SLOT bytes apart in bufs); the caller holds r->mu */
static int ring_take(ring_t *r, uint8_t *bufs, uint32_t *lens, uint8_t *ports, uint32_t max) {
    uint32_t n = 0;
    for (; r->head != r->tail && n < max; r->head++, n++) {
        slot_t *s = &r->slots[r->head % RING];
        memcpy(bufs + (size_t)n * SLOT, s->data, s->len);
        lens[n] = s->len; ports[n] = s->port;
    }
    return (int)n;
}

/* --- the data plane ------------------------------------------------------------------------------------------- */
typedef struct dp dp_t;
typedef struct {
    int (*rx)(dp_t *, int port, uint8_t **data, uint32_t *len, uint32_t max);
    int (*tx)(dp_t *, int port, uint8_t **data, const uint32_t *len, uint32_t n);  /* returns frames sent */
    void (*rx_done)(dp_t *, int port, uint32_t n);
    void (*idle)(dp_t *);
    void (*close)(dp_t *);
} backend_t;

struct dp {
    nat_t *nat;
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

static uint64_t mac64(const uint8_t *m) {
    return (uint64_t)m[0] << 40 | (uint64_t)m[1] << 32 | (uint64_t)m[2] << 24 | (uint64_t)m[3] << 16 |
           (uint64_t)m[4] << 8 | m[5];
}
static void mac_out(uint8_t *d, uint64_t v) { for (int i = 5; i >= 0; i--) { d[i] = v & 0xff; v >>= 8; } }
static double now_s(void) { struct timespec t; clock_gettime(CLOCK_REALTIME, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

/* Decide one frame. Returns the output port (rewritten frame at *out, *out_len), ACT_PUNT or ACT_DROP. */
static int decide(dp_t *dp, int port, uint8_t *d, uint32_t len, double now, uint8_t **out, uint32_t *out_len) {
    if (len < 14) { dp->c[C_DROP_MALFORMED]++; return ACT_DROP; }
    uint16_t et = rd16(d + 12);
    if (et == 0x0806) return ACT_PUNT;
    if (et != 0x0800 || memcmp(d, dp->mac[port], 6) != 0) { dp->c[C_IGNORED]++; return ACT_DROP; }
    if (port == UL) {
        const uint8_t *o = d + 14;
        if (len < 14 + 20 || o[0] != 0x45 || o[9] != 17 || rd32(o + 16) != dp->vtep_ip) return ACT_PUNT;
        if ((rd16(o + 6) & 0x3fff) || csum(o, 20) != 0) return ACT_PUNT;  /* fragments, bad sums: Python */
        if (len < 14 + 20 + 8 || rd16(o + 22) != VXLAN_PORT) return ACT_PUNT;
        uint64_t v;
        if (!map_get(dp->vteps, rd32(o + 12) | (1ULL << 32), &v)) { dp->c[C_DROP_UNKNOWN_VTEP]++; return ACT_DROP; }
        if (len < ENCAP + 14 + 20 || !(o[28] & 0x08)) { dp->c[C_DROP_MALFORMED]++; return ACT_DROP; }
        uint32_t vni = rd32(o + 32) >> 8;
        if (!map_get(dp->routers, vni | (1ULL << 32), &v)) { dp->c[C_DROP_UNKNOWN_VNI]++; return ACT_DROP; }
        uint8_t *inner = d + ENCAP + 14;
        if (rd16(inner - 2) != 0x0800) { dp->c[C_DROP_NOT_IPV4]++; return ACT_DROP; }
        uint32_t ilen = len - ENCAP - 14;
        uint64_t nh;  /* every destination is on-link on the external segment; unknown neighbour: Python ARPs */
        if (ilen < 20 || !map_get(dp->neigh[EXT], rd32(inner + 16) | (1ULL << 32), &nh)) return ACT_PUNT;
        if (outbound_(dp->nat, vni, inner, ilen, now) != NAT_OUT) return ACT_PUNT;
        uint8_t *e = inner - 14;
        mac_out(e, nh); memcpy(e + 6, dp->mac[EXT], 6); wr16(e + 12, 0x0800);
        *out = e; *out_len = ilen + 14;
        dp->c[C_FAST_OUT]++;
        return EXT;
    }
    /* EXT: an IPv4 frame to our MAC */
    uint8_t *ip = d + 14;
    uint32_t ilen = len - 14, vni, inside;
    if (inbound_(dp->nat, ip, ilen, now, &vni, &inside) != NAT_IN) return ACT_PUNT;
    uint64_t ep, nh, rmac;
    if (!map_get(dp->endpoints, ((uint64_t)vni << 32 | inside) + 1, &ep) ||
        !map_get(dp->routers, vni | (1ULL << 32), &rmac) || !map_get(dp->neigh[UL], (ep >> 16) | (1ULL << 32), &nh)) {
        /* translated already (there is no undo): Python gets the IP packet with its VNI and inside address in
         * place of the MAC addresses (punt port PUNT_TRANSLATED) and sends it once it knows the way */
        memset(d, 0, 12);
        wr32(d, vni); wr32(d + 4, inside);
        dp->c[C_FAST_IN]++;
        ring_push(&dp->punt, PUNT_TRANSLATED, d, len) ? dp->c[C_PUNT_FULL]++ : dp->c[C_PUNT]++;
        return ACT_DROP;
    }
    uint32_t vtep = (uint32_t)(ep >> 16);
    uint8_t *o = d - ENCAP;
    uint32_t total = ENCAP + 14 + ilen;
    mac_out(o, nh); memcpy(o + 6, dp->mac[UL], 6); wr16(o + 12, 0x0800);
    uint8_t *h = o + 14;
    h[0] = 0x45; h[1] = 0; wr16(h + 2, (uint16_t)(total - 14)); wr16(h + 4, 0); wr16(h + 6, 0x4000);
    h[8] = 64; h[9] = 17; wr16(h + 10, 0); wr32(h + 12, dp->vtep_ip); wr32(h + 16, vtep);
    wr16(h + 10, csum(h, 20));
    uint8_t *u = h + 20;  /* source port from the inner flow: ECMP entropy on the underlay, as Linux does */
    wr16(u, (uint16_t)(49152 | (mix(rd32(ip + 12) ^ rd32(ip + 16) ^ (uint64_t)ip[9] << 32) & 0x3fff)));
    wr16(u + 2, VXLAN_PORT); wr16(u + 4, (uint16_t)(total - 34)); wr16(u + 6, 0);
    uint8_t *x = u + 8;
    wr32(x, 0x08000000); wr32(x + 4, vni << 8);
    uint8_t *ie = x + 8;
    memcpy(ie, dp->ep_mac[ep & 0xffff], 6); mac_out(ie + 6, rmac); wr16(ie + 12, 0x0800);
    *out = o; *out_len = total;
    dp->c[C_FAST_IN]++;
    return UL;
}

/* One pass over both ports: receive a burst, decide each frame, transmit per output port. */
static int poll_once(dp_t *dp) {
    uint8_t *rx[BURST], *txd[2][BURST];
    uint32_t rxl[BURST], txl[2][BURST];
    int total = 0;
    for (int port = 0; port < 2; port++) {
        int n = dp->be->rx(dp, port, rx, rxl, BURST);
        if (n <= 0) continue;
        total += n;
        dp->c[port == UL ? C_RX_UL : C_RX_EXT] += n;
        dp->c[C_BURSTS]++;
        uint32_t nt[2] = {0, 0};
        double now = now_s();
        pthread_mutex_lock(&dp->cfg);
        pthread_mutex_lock(&dp->nat->mu);
        for (int i = 0; i < n; i++) {
            uint8_t *o; uint32_t ol;
            int act = decide(dp, port, rx[i], rxl[i], now, &o, &ol);
            if (act >= 0) { txd[act][nt[act]] = o; txl[act][nt[act]++] = ol; }
            else if (act == ACT_PUNT)
                ring_push(&dp->punt, (uint8_t)port, rx[i], rxl[i]) ? dp->c[C_PUNT_FULL]++ : dp->c[C_PUNT]++;
        }
        pthread_mutex_unlock(&dp->nat->mu);
        pthread_mutex_unlock(&dp->cfg);
        for (int p = 0; p < 2; p++) {
            if (!nt[p]) continue;
            int sent = dp->be->tx(dp, p, txd[p], txl[p], nt[p]);
            dp->c[p == UL ? C_TX_UL : C_TX_EXT] += sent > 0 ? sent : 0;
            if ((uint32_t)(sent > 0 ? sent : 0) < nt[p]) dp->c[C_TX_ERR] += nt[p] - (sent > 0 ? sent : 0);
        }
        dp->be->rx_done(dp, port, n);
    }
    /* frames Python asked us to send (slow path answers, ARP) */
    ring_t *r = &dp->inject;
    if (r->tail != r->head) {
        uint64_t drain;
        if (read(dp->evfd, &drain, 8) < 0) { /* nothing pending on the eventfd: fine */ }
        pthread_mutex_lock(&r->mu);
        while (r->head != r->tail) {
            slot_t *s = &r->slots[r->head % RING];
            uint8_t *d = s->data; uint32_t l = s->len;
            int sent = dp->be->tx(dp, s->port, &d, &l, 1);
            dp->c[s->port == UL ? C_TX_UL : C_TX_EXT] += sent > 0;
            if (sent <= 0) dp->c[C_TX_ERR]++;
            r->head++;
            total++;
        }
        pthread_mutex_unlock(&r->mu);
    }
    return total;
}

static void *loop(void *arg) {
    dp_t *dp = arg;
    while (dp->running) {
        if (poll_once(dp) == 0) { dp->nidle++; dp->be->idle(dp); }
        else dp->nidle = 0;
    }
    return NULL;
}

/* --- AF_PACKET backend: recvmmsg/sendmmsg bursts ------------------------------------------------------------ */
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <sys/socket.h>

typedef struct {
    int fd[2];
    uint8_t *buf[2];            /* BURST slots of HEADROOM + SLOT */
    struct mmsghdr msg[2][BURST];
    struct iovec iov[2][BURST];
    struct sockaddr_ll from[2][BURST];
} pk_t;

static int open_packet(const char *ifname, char *err) {
    int fd = socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK, htons(ETH_P_ALL));
    if (fd < 0) { snprintf(err, 256, "AF_PACKET socket: %s", strerror(errno)); return -1; }
    struct sockaddr_ll sll = {.sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_ALL),
                              .sll_ifindex = (int)if_nametoindex(ifname)};
    int one = 1, big = 4 << 20;
    setsockopt(fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    if (!sll.sll_ifindex || bind(fd, (struct sockaddr *)&sll, sizeof sll) < 0) {
        snprintf(err, 256, "bind AF_PACKET to %s: %s", ifname, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

static int pk_rx(dp_t *dp, int port, uint8_t **data, uint32_t *len, uint32_t max) {
    pk_t *s = dp->bs;
    for (uint32_t i = 0; i < max; i++) {
        s->iov[port][i].iov_base = s->buf[port] + (size_t)i * (HEADROOM + SLOT) + HEADROOM;
        s->iov[port][i].iov_len = SLOT;
        s->msg[port][i].msg_hdr = (struct msghdr){.msg_iov = &s->iov[port][i], .msg_iovlen = 1,
                                                  .msg_name = &s->from[port][i], .msg_namelen = sizeof(struct sockaddr_ll)};
    }
    int n = recvmmsg(s->fd[port], s->msg[port], max, MSG_DONTWAIT, NULL);
    for (int i = 0; i < n; i++) { data[i] = s->iov[port][i].iov_base; len[i] = s->msg[port][i].msg_len; }
    return n;
}
static int pk_tx(dp_t *dp, int port, uint8_t **data, const uint32_t *len, uint32_t n) {
    pk_t *s = dp->bs;
    struct mmsghdr m[BURST]; struct iovec v[BURST];
    if (n > BURST) n = BURST;
    for (uint32_t i = 0; i < n; i++) {
        v[i] = (struct iovec){.iov_base = data[i], .iov_len = len[i]};
        m[i] = (struct mmsghdr){.msg_hdr = {.msg_iov = &v[i], .msg_iovlen = 1}};
    }
    uint32_t done = 0;
    for (int tries = 0; done < n && tries < 64; tries++) {
        int r = sendmmsg(s->fd[port], m + done, n - done, 0);
        if (r > 0) done += (uint32_t)r;
        else if (errno != EAGAIN && errno != ENOBUFS) break;
    }
    return (int)done;
}
static void pk_rx_done(dp_t *dp, int port, uint32_t n) { (void)dp; (void)port; (void)n; }
static void pk_idle(dp_t *dp) {
    pk_t *s = dp->bs;
    struct pollfd p[3] = {{s->fd[0], POLLIN, 0}, {s->fd[1], POLLIN, 0}, {dp->evfd, POLLIN, 0}};
    poll(p, 3, 100);
}
static void pk_close(dp_t *dp) {
    pk_t *s = dp->bs;
    for (int p = 0; p < 2; p++) { if (s->fd[p] >= 0) close(s->fd[p]); free(s->buf[p]); }
    free(s);
}
static const backend_t PACKET = {pk_rx, pk_tx, pk_rx_done, pk_idle, pk_close};

static int packet_open(dp_t *dp, const char *ul, const char *ext) {
    pk_t *s = calloc(1, sizeof(pk_t));
    if (!s) return -1;
    s->fd[0] = s->fd[1] = -1;
    dp->bs = s; dp->be = &PACKET;
    const char *names[2] = {ul, ext};
    for (int p = 0; p < 2; p++) {
        s->buf[p] = malloc((size_t)BURST * (HEADROOM + SLOT));
        if (!s->buf[p] || (s->fd[p] = open_packet(names[p], dp->err)) < 0) return -1;
    }
    return 0;
}

/* --- memory backend: frames pushed and pulled by the caller, one poll at a time (tests: no interfaces, no
 * threads, deterministic). Built into every library. --------------------------------------------------------- */
typedef struct {
    uint8_t buf[2][BURST][HEADROOM + SLOT];
    uint32_t len[2][BURST], n[2];
    ring_t out;
} mem_t;

static int mem_rx(dp_t *dp, int port, uint8_t **data, uint32_t *len, uint32_t max) {
    mem_t *s = dp->bs;
    uint32_t n = s->n[port] < max ? s->n[port] : max;
    for (uint32_t i = 0; i < n; i++) { data[i] = s->buf[port][i] + HEADROOM; len[i] = s->len[port][i]; }
    return (int)n;
}
static int mem_tx(dp_t *dp, int port, uint8_t **data, const uint32_t *len, uint32_t n) {
    mem_t *s = dp->bs;
    uint32_t i = 0;
    for (; i < n; i++) if (ring_push(&s->out, (uint8_t)port, data[i], len[i])) break;
    return (int)i;
}
static void mem_rx_done(dp_t *dp, int port, uint32_t n) { ((mem_t *)dp->bs)->n[port] -= n; }
static void mem_idle(dp_t *dp) { (void)dp; }
static void mem_close(dp_t *dp) { free(((mem_t *)dp->bs)->out.slots); free(dp->bs); }
static const backend_t MEM = {mem_rx, mem_tx, mem_rx_done, mem_idle, mem_close};

static int mem_open(dp_t *dp) {
    mem_t *s = calloc(1, sizeof(mem_t));
    if (!s || ring_init(&s->out)) return -1;
    dp->bs = s; dp->be = &MEM;
    return 0;
}

int dp_mem_push(dp_t *dp, uint8_t port, const uint8_t *data, uint32_t len) {
    mem_t *s = dp->bs;
    if (dp->be != &MEM || port > 1 || len > SLOT || s->n[port] >= BURST) return -1;
    memcpy(s->buf[port][s->n[port]] + HEADROOM, data, len);
    s->len[port][s->n[port]++] = len;
    return 0;
}

int dp_poll(dp_t *dp) { return poll_once(dp); }

#ifdef TJ_XDP
/* --- AF_XDP backend through libxdp ---------------------------------------------------------------------- */
#include <linux/if_link.h>
#include <sys/mman.h>
#include <xdp/libxdp.h>
#include <xdp/xsk.h>

#define XFRAMES 4096
#define XFSIZE XSK_UMEM__DEFAULT_FRAME_SIZE
#define XRX (XFRAMES / 2)   /* first half: fill/rx, second half: tx */

typedef struct {
    struct xsk_umem *umem; struct xsk_socket *xsk; void *area;
    struct xsk_ring_prod fq, tx; struct xsk_ring_cons cq, rx;
    uint64_t txfree[XFRAMES - XRX]; uint32_t ntxfree;
    uint64_t rxaddr[BURST]; uint32_t ifindex;
} xport_t;
typedef struct { xport_t p[2]; } xs_t;

static int xport_open(xport_t *x, const char *ifname, char *err) {
    x->ifindex = if_nametoindex(ifname);
    if (!x->ifindex) { snprintf(err, 256, "no interface %s", ifname); return -1; }
    /* an XDP program left attached by a killed instance would eat traffic silently */
    struct xdp_multiprog *mp = xdp_multiprog__get_from_ifindex((int)x->ifindex);
    if (!libxdp_get_error(mp) && mp) { xdp_multiprog__detach(mp); xdp_multiprog__close(mp); }
    x->area = mmap(NULL, (size_t)XFRAMES * XFSIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (x->area == MAP_FAILED) { snprintf(err, 256, "mmap umem: %s", strerror(errno)); return -1; }
    struct xsk_umem_config uc = {.fill_size = XRX, .comp_size = XFRAMES - XRX, .frame_size = XFSIZE,
                                 .frame_headroom = HEADROOM, .flags = 0};
    int r = xsk_umem__create(&x->umem, x->area, (uint64_t)XFRAMES * XFSIZE, &x->fq, &x->cq, &uc);
    if (r) { snprintf(err, 256, "xsk_umem__create on %s: %s", ifname, strerror(-r)); return -1; }
    struct xsk_socket_config sc = {.rx_size = XRX, .tx_size = XFRAMES - XRX, .libxdp_flags = 0,
                                   .xdp_flags = XDP_FLAGS_SKB_MODE, .bind_flags = XDP_COPY};
    r = xsk_socket__create(&x->xsk, ifname, 0, x->umem, &x->rx, &x->tx, &sc);
    if (r) { snprintf(err, 256, "xsk_socket__create on %s: %s", ifname, strerror(-r)); return -1; }
    uint32_t idx;
    if (xsk_ring_prod__reserve(&x->fq, XRX, &idx) != XRX) { snprintf(err, 256, "fill ring"); return -1; }
    for (uint32_t i = 0; i < XRX; i++) *xsk_ring_prod__fill_addr(&x->fq, idx + i) = (uint64_t)i * XFSIZE;
    xsk_ring_prod__submit(&x->fq, XRX);
    for (uint32_t i = 0; i < XFRAMES - XRX; i++) x->txfree[i] = (uint64_t)(XRX + i) * XFSIZE;
    x->ntxfree = XFRAMES - XRX;
    return 0;
}

static int xs_rx(dp_t *dp, int port, uint8_t **data, uint32_t *len, uint32_t max) {
    xport_t *x = &((xs_t *)dp->bs)->p[port];
    uint32_t idx, n = xsk_ring_cons__peek(&x->rx, max, &idx);
    for (uint32_t i = 0; i < n; i++) {
        const struct xdp_desc *d = xsk_ring_cons__rx_desc(&x->rx, idx + i);
        x->rxaddr[i] = d->addr;
        data[i] = xsk_umem__get_data(x->area, d->addr);
        len[i] = d->len;
    }
    if (n) xsk_ring_cons__release(&x->rx, n);
    return (int)n;
}
static void xs_rx_done(dp_t *dp, int port, uint32_t n) {
    /* the frames were copied to the tx side (or punted by copy): give them straight back to the fill ring */
    xport_t *x = &((xs_t *)dp->bs)->p[port];
    uint32_t idx;
    while (xsk_ring_prod__reserve(&x->fq, n, &idx) != n) { /* the kernel drains the fill ring as it receives */ }
    for (uint32_t i = 0; i < n; i++) *xsk_ring_prod__fill_addr(&x->fq, idx + i) = xsk_umem__extract_addr(x->rxaddr[i]);
    xsk_ring_prod__submit(&x->fq, n);
}
static void xs_complete(xport_t *x) {
    uint32_t idx, n = xsk_ring_cons__peek(&x->cq, XFRAMES, &idx);
    for (uint32_t i = 0; i < n; i++) x->txfree[x->ntxfree++] = *xsk_ring_cons__comp_addr(&x->cq, idx + i);
    if (n) xsk_ring_cons__release(&x->cq, n);
}
static int xs_tx(dp_t *dp, int port, uint8_t **data, const uint32_t *len, uint32_t n) {
    xport_t *x = &((xs_t *)dp->bs)->p[port];
    xs_complete(x);
    if (n > x->ntxfree) n = x->ntxfree;
    uint32_t idx;
    if (!n || xsk_ring_prod__reserve(&x->tx, n, &idx) != n) return 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t a = x->txfree[--x->ntxfree];
        uint32_t l = len[i] > XFSIZE ? XFSIZE : len[i];
        memcpy(xsk_umem__get_data(x->area, a), data[i], l);
        struct xdp_desc *d = xsk_ring_prod__tx_desc(&x->tx, idx + i);
        d->addr = a; d->len = l;
    }
    xsk_ring_prod__submit(&x->tx, n);
    /* copy mode sends at most 32 frames per kick: kick until the ring is drained */
    for (int k = 0; k < 64; k++) {
        if (sendto(xsk_socket__fd(x->xsk), NULL, 0, MSG_DONTWAIT, NULL, 0) < 0 && errno != EAGAIN &&
            errno != ENOBUFS && errno != EBUSY) break;
        xs_complete(x);
        if (x->ntxfree == XFRAMES - XRX) break;
    }
    return (int)n;
}
static void xs_idle(dp_t *dp) {
    xs_t *s = dp->bs;
    struct pollfd p[3] = {{xsk_socket__fd(s->p[0].xsk), POLLIN, 0}, {xsk_socket__fd(s->p[1].xsk), POLLIN, 0},
                          {dp->evfd, POLLIN, 0}};
    poll(p, 3, 100);
}
static void xs_close(dp_t *dp) {
    xs_t *s = dp->bs;
    for (int p = 0; p < 2; p++) {
        if (s->p[p].xsk) xsk_socket__delete(s->p[p].xsk);
        if (s->p[p].umem) xsk_umem__delete(s->p[p].umem);
        if (s->p[p].area && s->p[p].area != MAP_FAILED) munmap(s->p[p].area, (size_t)XFRAMES * XFSIZE);
        struct xdp_multiprog *mp = s->p[p].ifindex ? xdp_multiprog__get_from_ifindex((int)s->p[p].ifindex) : NULL;
        if (mp && !libxdp_get_error(mp)) { xdp_multiprog__detach(mp); xdp_multiprog__close(mp); }
    }
    free(s);
}
static const backend_t XDP = {xs_rx, xs_tx, xs_rx_done, xs_idle, xs_close};

static int xdp_open(dp_t *dp, const char *ul, const char *ext) {
    xs_t *s = calloc(1, sizeof(xs_t));
    if (!s) return -1;
    dp->bs = s; dp->be = &XDP;
    if (xport_open(&s->p[0], ul, dp->err) || xport_open(&s->p[1], ext, dp->err)) return -1;
    return 0;
}
#endif

#ifdef TJ_DPDK
/* --- DPDK backend: ethdev vdevs, the loop on a worker lcore ------------------------------------------------ */
#include <rte_eal.h>
#include <rte_ethdev.h>
#include <rte_launch.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>

typedef struct {
    uint16_t port[2];
    struct rte_mempool *pool;
    struct rte_mbuf *rx[2][BURST];
} dk_t;

static int dk_rx(dp_t *dp, int port, uint8_t **data, uint32_t *len, uint32_t max) {
    dk_t *s = dp->bs;
    uint16_t n = rte_eth_rx_burst(s->port[port], 0, s->rx[port], (uint16_t)max);
    for (uint16_t i = 0; i < n; i++) {
        data[i] = rte_pktmbuf_mtod(s->rx[port][i], uint8_t *);
        len[i] = rte_pktmbuf_data_len(s->rx[port][i]);
    }
    return n;
}
static int dk_tx(dp_t *dp, int port, uint8_t **data, const uint32_t *len, uint32_t n) {
    /* copy into fresh mbufs: the received ones go back to the pool in rx_done; 64-byte frames copy cheaply */
    dk_t *s = dp->bs;
    struct rte_mbuf *m[BURST];
    if (n > BURST) n = BURST;
    if (rte_pktmbuf_alloc_bulk(s->pool, m, n)) return 0;
    for (uint32_t i = 0; i < n; i++) {
        uint8_t *d = (uint8_t *)rte_pktmbuf_append(m[i], (uint16_t)len[i]);
        if (d) memcpy(d, data[i], len[i]);
    }
    uint16_t sent = 0;
    for (int tries = 0; sent < n && tries < 64; tries++) sent += rte_eth_tx_burst(s->port[port], 0, m + sent, (uint16_t)(n - sent));
    if (sent < n) rte_pktmbuf_free_bulk(m + sent, n - sent);
    return sent;
}
static void dk_rx_done(dp_t *dp, int port, uint32_t n) { rte_pktmbuf_free_bulk(((dk_t *)dp->bs)->rx[port], n); }
static void dk_idle(dp_t *dp) {
    /* these vdevs have no rx interrupts: spin while traffic flows, back off when it stops, so that an idle
     * gateway does not burn its core (adaptive polling: at most 0.5 ms added to the first packet after a lull) */
    if (dp->nidle < 256) return;
    struct timespec t = {0, dp->nidle < 20000 ? 10000 : 500000};
    nanosleep(&t, NULL);
}
static void dk_close(dp_t *dp) {
    dk_t *s = dp->bs;
    for (int p = 0; p < 2; p++) { rte_eth_dev_stop(s->port[p]); rte_eth_dev_close(s->port[p]); }
    free(s);
}
static const backend_t DPDK = {dk_rx, dk_tx, dk_rx_done, dk_idle, dk_close};

static int dk_port(dp_t *dp, dk_t *s, uint16_t pid) {
    struct rte_eth_conf conf;
    memset(&conf, 0, sizeof conf);
    if (rte_eth_dev_configure(pid, 1, 1, &conf) < 0 ||
        rte_eth_rx_queue_setup(pid, 0, 1024, (unsigned)rte_eth_dev_socket_id(pid), NULL, s->pool) < 0 ||
        rte_eth_tx_queue_setup(pid, 0, 1024, (unsigned)rte_eth_dev_socket_id(pid), NULL) < 0 ||
        rte_eth_dev_start(pid) < 0) {
        snprintf(dp->err, 256, "DPDK port %u: configure/start failed", pid);
        return -1;
    }
    rte_eth_promiscuous_enable(pid);
    return 0;
}

static int dk_worker(void *arg) { loop(arg); return 0; }

/* args: the EAL argument vector, space separated (the Python side composes it; vdev 0 = UL, vdev 1 = EXT) */
static int dpdk_open(dp_t *dp, const char *eal_args) {
    char *copy = strdup(eal_args), *argv[64], *save = NULL;
    int argc = 0;
    argv[argc++] = "tianji-gateway";
    for (char *t = strtok_r(copy, " ", &save); t && argc < 63; t = strtok_r(NULL, " ", &save)) argv[argc++] = t;
    argv[argc] = NULL;
    cpu_set_t before;
    sched_getaffinity(0, sizeof before, &before);
    int r = rte_eal_init(argc, argv);
    sched_setaffinity(0, sizeof before, &before);  /* EAL pins the caller: give Python's threads all cores back */
    if (r < 0) { snprintf(dp->err, 256, "rte_eal_init failed: %s", rte_strerror(rte_errno)); return -1; }
    if (rte_eth_dev_count_avail() < 2) { snprintf(dp->err, 256, "DPDK found %u ports, need 2", rte_eth_dev_count_avail()); return -1; }
    dk_t *s = calloc(1, sizeof(dk_t));
    dp->bs = s; dp->be = &DPDK;
    s->pool = rte_pktmbuf_pool_create("tj_pool", 8191, 256, 0, RTE_MBUF_DEFAULT_BUF_SIZE, (int)rte_socket_id());
    if (!s->pool) { snprintf(dp->err, 256, "mbuf pool: %s", rte_strerror(rte_errno)); return -1; }
    s->port[0] = 0; s->port[1] = 1;
    if (dk_port(dp, s, 0) || dk_port(dp, s, 1)) return -1;
    return 0;
}
#endif

/* --- the API Python calls through ctypes -------------------------------------------------------------------- */
dp_t *dp_create(nat_t *nat, const uint8_t *ul_mac, const uint8_t *ext_mac, uint32_t vtep_ip) {
    dp_t *dp = calloc(1, sizeof(dp_t));
    if (!dp) return NULL;
    dp->nat = nat; memcpy(dp->mac[UL], ul_mac, 6); memcpy(dp->mac[EXT], ext_mac, 6); dp->vtep_ip = vtep_ip;
    pthread_mutex_init(&dp->cfg, NULL);
    dp->evfd = -1;
    if (ring_init(&dp->punt) || ring_init(&dp->inject) || (dp->evfd = eventfd(0, EFD_NONBLOCK)) < 0) {
        free(dp->punt.slots); free(dp->inject.slots); free(dp);
        return NULL;
    }
    return dp;
}

const char *dp_error(dp_t *dp) { return dp->err; }

/* backend: "packet", "xdp" or "dpdk"; for dpdk, `arg` is the EAL argument string, otherwise "UL_IF EXT_IF" */
int dp_open(dp_t *dp, const char *backend, const char *ul, const char *ext, const char *arg) {
    (void)arg;
    if (!strcmp(backend, "packet")) return packet_open(dp, ul, ext);
    if (!strcmp(backend, "mem")) return mem_open(dp);
#ifdef TJ_XDP
    if (!strcmp(backend, "xdp")) return xdp_open(dp, ul, ext);
#endif
#ifdef TJ_DPDK
    if (!strcmp(backend, "dpdk")) return dpdk_open(dp, arg);
#endif
    snprintf(dp->err, 256, "backend %s is not built into this library", backend);
    return -1;
}

int dp_start(dp_t *dp) {
    dp->running = 1;
#ifdef TJ_DPDK
    if (dp->be == &DPDK) {
        unsigned worker = rte_get_next_lcore(-1, 1, 0);
        if (worker >= RTE_MAX_LCORE) { snprintf(dp->err, 256, "no worker lcore: give EAL -l with two cores"); return -1; }
        return rte_eal_remote_launch(dk_worker, dp, worker);
    }
#endif
    return pthread_create(&dp->thread, NULL, loop, dp);
}

void dp_stop(dp_t *dp) {
    if (!dp->running) return;
    dp->running = 0;
    uint64_t one = 1;
    if (write(dp->evfd, &one, 8) < 0) { /* the loop also wakes on its poll timeout */ }
#ifdef TJ_DPDK
    if (dp->be == &DPDK) { rte_eal_mp_wait_lcore(); return; }
#endif
    pthread_join(dp->thread, NULL);
}

void dp_close(dp_t *dp) {
    dp_stop(dp);
    if (dp->be) dp->be->close(dp);
    dp->be = NULL;
}

/* Wait up to timeout_ms for punted frames; copies up to max into bufs (SLOT bytes each). */
int dp_punt(dp_t *dp, uint8_t *bufs, uint32_t *lens, uint8_t *ports, uint32_t max, int timeout_ms) {
    ring_t *r = &dp->punt;
    pthread_mutex_lock(&r->mu);
    if (r->head == r->tail && timeout_ms > 0) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        t.tv_nsec += (long)timeout_ms * 1000000L;
        t.tv_sec += t.tv_nsec / 1000000000L; t.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&r->cv, &r->mu, &t);
    }
    int n = ring_take(r, bufs, lens, ports, max);
    pthread_mutex_unlock(&r->mu);
    return n;
}

/* memory backend: what the loop transmitted, oldest first (same layout as dp_punt) */
int dp_mem_pop(dp_t *dp, uint8_t *bufs, uint32_t *lens, uint8_t *ports, uint32_t max) {
    if (dp->be != &MEM) return -1;
    ring_t *r = &((mem_t *)dp->bs)->out;
    pthread_mutex_lock(&r->mu);
    int n = ring_take(r, bufs, lens, ports, max);
    pthread_mutex_unlock(&r->mu);
    return n;
}

int dp_inject(dp_t *dp, uint8_t port, const uint8_t *data, uint32_t len) {
    if (port > 1 || len > SLOT) return -1;
    if (ring_push(&dp->inject, port, data, len)) { dp->c[C_INJECT_FULL]++; return -1; }
    dp->c[C_INJECT]++;
    uint64_t one = 1;
    if (write(dp->evfd, &one, 8) < 0) { /* counter saturated: the loop is awake anyway */ }
    return 0;
}

/* Config, pushed whole by Python on every revision (swapped under the lock; bursts never see half of it). */
int dp_set_config(dp_t *dp, const uint32_t *vteps, uint32_t nvteps, const uint32_t *vnis, const uint8_t *rmacs,
                  uint32_t nvpcs, const uint32_t *ep_vni, const uint32_t *ep_ip, const uint32_t *ep_vtep,
                  const uint8_t *ep_mac, uint32_t nep) {
    map_t *v = map_new(nvteps), *r = map_new(nvpcs), *e = map_new(nep);
    uint8_t (*macs)[6] = malloc(6 * (size_t)(nep ? nep : 1));
    if (!v || !r || !e || !macs || nep > 0xffff) { map_free(v); map_free(r); map_free(e); free(macs); return -1; }
    int full = 0;  /* a map sized for its entries cannot fill, but a config that did not fit is refused whole */
    for (uint32_t i = 0; i < nvteps; i++) full |= map_put(v, vteps[i] | (1ULL << 32), 1);
    for (uint32_t i = 0; i < nvpcs; i++) full |= map_put(r, vnis[i] | (1ULL << 32), mac64(rmacs + 6 * i));
    for (uint32_t i = 0; i < nep; i++) {
        memcpy(macs[i], ep_mac + 6 * i, 6);
        full |= map_put(e, ((uint64_t)ep_vni[i] << 32 | ep_ip[i]) + 1, (uint64_t)ep_vtep[i] << 16 | i);
    }
    if (full) { map_free(v); map_free(r); map_free(e); free(macs); return -1; }
    pthread_mutex_lock(&dp->cfg);
    map_t *ov = dp->vteps, *orr = dp->routers, *oe = dp->endpoints;
    uint8_t (*om)[6] = dp->ep_mac;
    dp->vteps = v; dp->routers = r; dp->endpoints = e; dp->ep_mac = macs;
    pthread_mutex_unlock(&dp->cfg);
    map_free(ov); map_free(orr); map_free(oe); free(om);
    return 0;
}

/* vtep lookups use key (ip | 1 << 32) so that address 0.0.0.0 never collides with the empty key */
int dp_set_neigh(dp_t *dp, uint8_t port, uint32_t ip, const uint8_t *mac) {
    if (port > 1) return -1;
    pthread_mutex_lock(&dp->cfg);
    if (!dp->neigh[port]) dp->neigh[port] = map_new(1024);
    int r = dp->neigh[port] ? map_put(dp->neigh[port], ip | (1ULL << 32), mac64(mac)) : -1;
    pthread_mutex_unlock(&dp->cfg);
    return r;
}

void dp_stats(dp_t *dp, uint64_t *out) { memcpy(out, dp->c, sizeof dp->c); }
uint32_t dp_nstats(void) { return C_COUNT; }
