/* AF_PACKET backend (always available): frames received into a TPACKET_V2 ring mapped from the kernel (no system
 * call or copy per frame; each slot keeps HEADROOM before its frame, PACKET_RESERVE), sent with sendmmsg bursts.
 * An 802.1Q tag the receiving kernel moved into the slot's header (it does so on veth whatever rxvlan says) is
 * written back into the frame: every backend gives the stages frames as they were on the wire. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <net/if.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include "tj_loop.h"

#define RFRAME 8192            /* a slot: the kernel's header, HEADROOM, then up to DP_SLOT bytes of frame */
#define RFRAMES 2048

typedef struct {
    int fd[2];
    uint8_t *ring[2];           /* RFRAMES slots of RFRAME bytes */
    uint32_t head[2];           /* the next slot to read */
    uint32_t held[2];           /* the first slot read but not yet given back */
} pk_t;

static int open_packet(const char *ifname, char *err) {
    int fd = socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK, htons(ETH_P_ALL));
    if (fd < 0) { snprintf(err, 256, "AF_PACKET socket: %s", strerror(errno)); return -1; }
    struct sockaddr_ll sll = {.sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_ALL),
                              .sll_ifindex = (int)if_nametoindex(ifname)};
    int one = 1, big = 4 << 20, v2 = TPACKET_V2, reserve = HEADROOM;
    setsockopt(fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    struct tpacket_req req = {.tp_block_size = RFRAME, .tp_block_nr = RFRAMES, .tp_frame_size = RFRAME,
                              .tp_frame_nr = RFRAMES};
    if (setsockopt(fd, SOL_PACKET, PACKET_VERSION, &v2, sizeof v2) < 0 ||
        setsockopt(fd, SOL_PACKET, PACKET_RESERVE, &reserve, sizeof reserve) < 0 ||
        setsockopt(fd, SOL_PACKET, PACKET_RX_RING, &req, sizeof req) < 0) {
        snprintf(err, 256, "AF_PACKET ring on %s: %s", ifname, strerror(errno));
        close(fd);
        return -1;
    }
    if (!sll.sll_ifindex || bind(fd, (struct sockaddr *)&sll, sizeof sll) < 0) {
        snprintf(err, 256, "bind AF_PACKET to %s: %s", ifname, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

static struct tpacket2_hdr *slot(pk_t *s, int port, uint32_t i) {
    return (struct tpacket2_hdr *)(s->ring[port] + (size_t)(i % RFRAMES) * RFRAME);
}
static int pk_rx(dp_t *dp, int port, uint8_t **data, uint32_t *len, uint32_t max) {
    pk_t *s = dp->bs;
    uint32_t n = 0;
    for (; n < max; n++) {
        struct tpacket2_hdr *h = slot(s, port, s->head[port]);
        if (!(__atomic_load_n(&h->tp_status, __ATOMIC_ACQUIRE) & TP_STATUS_USER)) break;
        data[n] = (uint8_t *)h + h->tp_mac;
        len[n] = h->tp_snaplen > DP_SLOT ? DP_SLOT : h->tp_snaplen;  /* cut, as every backend: its IP length fails */
        if (h->tp_status & TP_STATUS_VLAN_VALID) {  /* the kernel took the tag into the ring's header: put it back */
            uint8_t *f = data[n] - 4;
            memmove(f, data[n], 12);
            wr16(f + 12, h->tp_status & TP_STATUS_VLAN_TPID_VALID ? h->tp_vlan_tpid : 0x8100);
            wr16(f + 14, h->tp_vlan_tci);
            data[n] = f;
            len[n] = len[n] + 4 > DP_SLOT ? DP_SLOT : len[n] + 4;
        }
        s->head[port]++;
    }
    return (int)n;
}
static int pk_tx(dp_t *dp, int port, uint8_t **data, const uint32_t *len, uint32_t n) {
    pk_t *s = dp->bs;
    struct mmsghdr m[DP_BURST]; struct iovec v[DP_BURST];
    if (n > DP_BURST) n = DP_BURST;
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
static void pk_rx_done(dp_t *dp, int port, uint32_t n) {
    pk_t *s = dp->bs;  /* the slots go back to the kernel once their frames were sent or copied */
    for (uint32_t i = 0; i < n; i++, s->held[port]++)
        __atomic_store_n(&slot(s, port, s->held[port])->tp_status, TP_STATUS_KERNEL, __ATOMIC_RELEASE);
}
static void pk_idle(dp_t *dp) {
    pk_t *s = dp->bs;
    dp_wait(dp, s->fd[0], s->fd[1]);
}
static void pk_close(dp_t *dp) {
    pk_t *s = dp->bs;
    for (int p = 0; p < 2; p++) {
        if (s->ring[p] && s->ring[p] != MAP_FAILED) munmap(s->ring[p], (size_t)RFRAMES * RFRAME);
        if (s->fd[p] >= 0) close(s->fd[p]);
    }
    free(s);
}
static const backend_t PACKET = {.rx = pk_rx, .tx = pk_tx, .rx_done = pk_rx_done, .idle = pk_idle, .close = pk_close};

int io_packet_open(dp_t *dp, const char *ul, const char *ext) {
    pk_t *s = calloc(1, sizeof(pk_t));
    if (!s) return -1;
    s->fd[0] = s->fd[1] = -1;
    dp->bs = s; dp->be = &PACKET;
    const char *names[2] = {ul, ext};
    for (int p = 0; p < 2; p++) {
        if ((s->fd[p] = open_packet(names[p], dp->err)) < 0) return -1;
        s->ring[p] = mmap(NULL, (size_t)RFRAMES * RFRAME, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd[p], 0);
        if (s->ring[p] == MAP_FAILED) { snprintf(dp->err, 256, "mmap AF_PACKET ring: %s", strerror(errno)); return -1; }
    }
    return 0;
}

