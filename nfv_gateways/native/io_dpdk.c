/* DPDK backend: ethdev vdevs (net_af_xdp here), the loop on a worker lcore: built only with libdpdk (-DTJ_DPDK). */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <rte_eal.h>
#include <rte_ethdev.h>
#include <rte_launch.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>

#include "tj_loop.h"

typedef struct {
    uint16_t port[2];
    struct rte_mempool *pool[2];   /* one per port: the af_xdp PMD makes each port's umem of its pool */
    struct rte_mbuf *rx[2][DP_BURST];
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
    struct rte_mbuf *m[DP_BURST];
    if (n > DP_BURST) n = DP_BURST;
    if (rte_pktmbuf_alloc_bulk(s->pool[port], m, n)) return 0;
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

static int dk_port(dp_t *dp, dk_t *s, uint16_t pid) {
    struct rte_eth_conf conf;
    memset(&conf, 0, sizeof conf);
    if (rte_eth_dev_configure(pid, 1, 1, &conf) < 0 ||
        rte_eth_rx_queue_setup(pid, 0, 1024, (unsigned)rte_eth_dev_socket_id(pid), NULL, s->pool[pid]) < 0 ||
        rte_eth_tx_queue_setup(pid, 0, 1024, (unsigned)rte_eth_dev_socket_id(pid), NULL) < 0 ||
        rte_eth_dev_start(pid) < 0) {
        snprintf(dp->err, sizeof dp->err, "DPDK port %u: configure/start failed", pid);
        return -1;
    }
    rte_eth_promiscuous_enable(pid);
    return 0;
}

static int dk_worker(void *arg) { dp_loop(arg); return 0; }
static int dk_start(dp_t *dp) {
    unsigned worker = rte_get_next_lcore((unsigned)-1, 1, 0);
    if (worker >= RTE_MAX_LCORE) { snprintf(dp->err, sizeof dp->err, "no worker lcore: give EAL -l with two cores"); return -1; }
    return rte_eal_remote_launch(dk_worker, dp, worker);
}
static void dk_join(dp_t *dp) { (void)dp; rte_eal_mp_wait_lcore(); }

static const backend_t DPDK = {.rx = dk_rx, .tx = dk_tx, .rx_done = dk_rx_done, .idle = dk_idle, .close = dk_close,
                                  .start = dk_start, .join = dk_join};

/* args: the EAL argument vector, space separated (the Python side composes it; vdev 0 = UL, vdev 1 = EXT) */
int io_dpdk_open(dp_t *dp, const char *eal_args) {
    /* the copy stays: EAL may keep pointers into argv for the process's lifetime */
    char *copy = strdup(eal_args), *argv[64], *save = NULL;
    if (!copy) return -1;
    int argc = 0;
    argv[argc++] = "tianji-gateway";
    for (char *t = strtok_r(copy, " ", &save); t && argc < 63; t = strtok_r(NULL, " ", &save)) argv[argc++] = t;
    argv[argc] = NULL;
    cpu_set_t before;
    sched_getaffinity(0, sizeof before, &before);
    int r = rte_eal_init(argc, argv);
    sched_setaffinity(0, sizeof before, &before);  /* EAL pins the caller: give Python's threads all cores back */
    if (r < 0) { snprintf(dp->err, sizeof dp->err, "rte_eal_init failed: %s", rte_strerror(rte_errno)); return -1; }
    if (rte_eth_dev_count_avail() < 2) { snprintf(dp->err, sizeof dp->err, "DPDK found %u ports, need 2", rte_eth_dev_count_avail()); return -1; }
    dk_t *s = calloc(1, sizeof(dk_t));
    if (!s) return -1;
    dp->bs = s; dp->be = &DPDK;
    /* the af_xdp PMD builds its umem from these mbufs, one page each: frames up to 2 KB (DP_DPDK_MAX_FRAME) */
    for (int p = 0; p < 2; p++) {
        s->pool[p] = rte_pktmbuf_pool_create(p ? "tj_pool1" : "tj_pool0", 8191, 256, 0, RTE_MBUF_DEFAULT_BUF_SIZE,
                                             (int)rte_socket_id());
        if (!s->pool[p]) { snprintf(dp->err, sizeof dp->err, "mbuf pool: %s", rte_strerror(rte_errno)); return -1; }
    }
    s->port[0] = 0; s->port[1] = 1;
    if (dk_port(dp, s, 0) || dk_port(dp, s, 1)) return -1;
    return 0;
}
