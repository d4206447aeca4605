/* AF_XDP backend through libxdp (copy mode on veth): built only where libxdp and libbpf are (-DTJ_XDP). With the
 * flow cache's object (tj_xdp.bpf.c, `arg` of dp_open), each port runs that program in front of its socket and the
 * stages may hand it flows (include/tj_xdp.h); without it, libxdp's own program sends every frame to the socket. */
#include <errno.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <linux/if_link.h>
#include <sys/mman.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <xdp/libxdp.h>
#include <xdp/xsk.h>

#include "tj_loop.h"

#define XFRAMES 4096
#define XFSIZE XSK_UMEM__DEFAULT_FRAME_SIZE
#define XRX (XFRAMES / 2)   /* first half: fill/rx, second half: tx */

typedef struct {
    struct xsk_umem *umem; struct xsk_socket *xsk; void *area;
    struct xsk_ring_prod fq, tx; struct xsk_ring_cons cq, rx;
    uint64_t txfree[XFRAMES - XRX]; uint32_t ntxfree;
    uint64_t rxaddr[DP_BURST]; uint32_t ifindex;
    struct bpf_object *obj;     /* the flow cache's program on this port, or NULL */
    int flows_fd, carried_fd, epoch_fd;
    uint32_t mode;
} xport_t;
typedef struct { xport_t p[2]; uint32_t epoch; } xs_t;

/* the flow cache's program `prog` from `path` on the port, before its socket is made; `lru` entries of an LRU map
 * for a stateless stage's flows (0: a hash, each entry taken back by its stage) */
static int cache_attach(xport_t *x, const char *path, const char *prog, const char *ifname, uint32_t lru,
                        char *err) {
    x->obj = bpf_object__open_file(path, NULL);
    if (libbpf_get_error(x->obj)) {
        x->obj = NULL;
        snprintf(err, 256, "open %s: %s", path, strerror(errno));
        return -1;
    }
    struct bpf_map *flows = bpf_object__find_map_by_name(x->obj, "flows");
    if (lru && flows && (bpf_map__set_type(flows, BPF_MAP_TYPE_LRU_HASH) || bpf_map__set_map_flags(flows, 0) ||
                         bpf_map__set_max_entries(flows, lru))) {
        snprintf(err, 256, "%s: the flows map cannot be an LRU of %u", path, lru);
        return -1;
    }
    int r = bpf_object__load(x->obj);
    struct bpf_program *p = r ? NULL : bpf_object__find_program_by_name(x->obj, prog);
    if (!p) { snprintf(err, 256, "load %s (%s): %s", path, prog, strerror(r ? -r : ENOENT)); return -1; }
    x->flows_fd = bpf_object__find_map_fd_by_name(x->obj, "flows");
    x->carried_fd = bpf_object__find_map_fd_by_name(x->obj, "carried");
    x->epoch_fd = bpf_object__find_map_fd_by_name(x->obj, "epoch");
    const char *mode = getenv("TIANJI_XDP_MODE");
    x->mode = mode && !strcmp(mode, "drv") ? XDP_FLAGS_DRV_MODE : XDP_FLAGS_SKB_MODE;
    r = bpf_xdp_attach((int)x->ifindex, bpf_program__fd(p), x->mode, NULL);
    if (r) { snprintf(err, 256, "attach %s on %s: %s", prog, ifname, strerror(-r)); return -1; }
    return 0;
}

static int xport_open(xport_t *x, const char *ifname, const char *cache, const char *prog, uint32_t lru, char *err) {
    x->ifindex = if_nametoindex(ifname);
    if (!x->ifindex) { snprintf(err, 256, "no interface %s", ifname); return -1; }
    /* an XDP program left attached by a killed instance would eat traffic silently */
    struct xdp_multiprog *mp = xdp_multiprog__get_from_ifindex((int)x->ifindex);
    if (!libxdp_get_error(mp) && mp) { xdp_multiprog__detach(mp); xdp_multiprog__close(mp); }
    x->flows_fd = x->carried_fd = x->epoch_fd = -1;
    if (cache && *cache && cache_attach(x, cache, prog, ifname, lru, err)) return -1;
    x->area = mmap(NULL, (size_t)XFRAMES * XFSIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (x->area == MAP_FAILED) { snprintf(err, 256, "mmap umem: %s", strerror(errno)); return -1; }
    struct xsk_umem_config uc = {.fill_size = XRX, .comp_size = XFRAMES - XRX, .frame_size = XFSIZE,
                                 .frame_headroom = HEADROOM, .flags = 0};
    int r = xsk_umem__create(&x->umem, x->area, (uint64_t)XFRAMES * XFSIZE, &x->fq, &x->cq, &uc);
    if (r) { snprintf(err, 256, "xsk_umem__create on %s: %s", ifname, strerror(-r)); return -1; }
    struct xsk_socket_config sc = {.rx_size = XRX, .tx_size = XFRAMES - XRX,
                                   .libxdp_flags = x->obj ? XSK_LIBXDP_FLAGS__INHIBIT_PROG_LOAD : 0,
                                   .xdp_flags = x->obj ? x->mode : XDP_FLAGS_SKB_MODE, .bind_flags = XDP_COPY};
    r = xsk_socket__create(&x->xsk, ifname, 0, x->umem, &x->rx, &x->tx, &sc);
    if (r) { snprintf(err, 256, "xsk_socket__create on %s: %s", ifname, strerror(-r)); return -1; }
    if (x->obj && (r = xsk_socket__update_xskmap(x->xsk, bpf_object__find_map_fd_by_name(x->obj, "xsks")))) {
        snprintf(err, 256, "xsks map on %s: %s", ifname, strerror(-r)); return -1;
    }
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
    dp_wait(dp, xsk_socket__fd(s->p[0].xsk), xsk_socket__fd(s->p[1].xsk));
}
static void xs_close(dp_t *dp) {
    xs_t *s = dp->bs;
    for (int p = 0; p < 2; p++) {
        if (s->p[p].xsk) xsk_socket__delete(s->p[p].xsk);
        if (s->p[p].umem) xsk_umem__delete(s->p[p].umem);
        if (s->p[p].area && s->p[p].area != MAP_FAILED) munmap(s->p[p].area, (size_t)XFRAMES * XFSIZE);
        if (s->p[p].obj) {
            bpf_xdp_detach((int)s->p[p].ifindex, s->p[p].mode, NULL);
            bpf_object__close(s->p[p].obj);
            continue;
        }
        struct xdp_multiprog *mp = s->p[p].ifindex ? xdp_multiprog__get_from_ifindex((int)s->p[p].ifindex) : NULL;
        if (mp && !libxdp_get_error(mp)) { xdp_multiprog__detach(mp); xdp_multiprog__close(mp); }
    }
    free(s);
}

/* --- the flow cache (include/tj_xdp.h) --- */
static int xs_flow_put(dp_t *dp, int port, const struct tj_flow_key *k, struct tj_flow_act *a, int out_port) {
    xs_t *s = dp->bs;
    if (s->p[port].flows_fd < 0) return -1;
    a->tx = out_port == port;
    a->ifindex = s->p[out_port].ifindex;
    a->epoch = s->epoch;
    return bpf_map_update_elem(s->p[port].flows_fd, k, a, BPF_ANY) ? -1 : 0;
}
static int xs_flow_take(dp_t *dp, int port, const struct tj_flow_key *k, int remove, uint64_t *last_ns) {
    xs_t *s = dp->bs;
    struct tj_flow_act a;
    if (s->p[port].flows_fd < 0 || bpf_map_lookup_elem(s->p[port].flows_fd, k, &a)) return -1;
    *last_ns = a.last_ns;
    if (remove) bpf_map_delete_elem(s->p[port].flows_fd, k);
    return 0;
}
static void xs_flow_drop_all(dp_t *dp) {
    xs_t *s = dp->bs;
    uint32_t zero = 0, next = s->epoch + 1;
    for (int p = 0; p < 2; p++)
        if (s->p[p].epoch_fd >= 0 && bpf_map_update_elem(s->p[p].epoch_fd, &zero, &next, BPF_ANY)) return;
    s->epoch = next;  /* (a port that refused keeps the old epoch: the next bump tries again, nothing is carried wrong) */
}
static uint64_t xs_flow_carried(dp_t *dp) {
    xs_t *s = dp->bs;
    uint64_t total = 0, per_cpu[256];
    uint32_t zero = 0;
    int ncpu = libbpf_num_possible_cpus();
    for (int p = 0; p < 2 && ncpu > 0 && ncpu <= 256; p++)
        if (s->p[p].carried_fd >= 0 && !bpf_map_lookup_elem(s->p[p].carried_fd, &zero, per_cpu))
            for (int c = 0; c < ncpu; c++) total += per_cpu[c];
    return total;
}
static const backend_t XDP = {.rx = xs_rx, .tx = xs_tx, .rx_done = xs_rx_done, .idle = xs_idle, .close = xs_close,
                              .flow_put = xs_flow_put, .flow_take = xs_flow_take, .flow_carried = xs_flow_carried,
                              .flow_drop_all = xs_flow_drop_all};

int io_xdp_open(dp_t *dp, const char *ul, const char *ext, const char *cache) {
    xs_t *s = calloc(1, sizeof(xs_t));
    if (!s) return -1;
    dp->bs = s; dp->be = &XDP;
    if (xport_open(&s->p[0], ul, cache, "tj_xdp_ul", dp->cache_lru, dp->err)) return -1;
    if (xport_open(&s->p[1], ext, cache, "tj_xdp_ext", dp->cache_lru, dp->err)) return -1;
    return 0;
}

int dp_xdp_test(const char *obj, uint8_t port, const void *key, const void *act, const uint8_t *in, uint32_t len,
                uint8_t *out, uint32_t *out_len) {
    struct bpf_object *o = bpf_object__open_file(obj, NULL);
    if (libbpf_get_error(o)) return -1;
    int r = -1;
    struct bpf_program *p = bpf_object__load(o) ? NULL
                            : bpf_object__find_program_by_name(o, port == DP_UL ? "tj_xdp_ul" : "tj_xdp_ext");
    if (p && !bpf_map_update_elem(bpf_object__find_map_fd_by_name(o, "flows"), key, act, BPF_ANY)) {
        LIBBPF_OPTS(bpf_test_run_opts, t, .data_in = in, .data_size_in = len, .data_out = out,
                    .data_size_out = *out_len, .repeat = 1);
        if (!bpf_prog_test_run_opts(bpf_program__fd(p), &t)) { r = (int)t.retval; *out_len = t.data_size_out; }
    }
    bpf_object__close(o);
    return r;
}
