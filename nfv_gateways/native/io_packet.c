/* AF_PACKET backend: recvmmsg/sendmmsg bursts on raw sockets (always available). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <net/if.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <sys/socket.h>

#include "tj_dp.h"

typedef struct {
    int fd[2];
    uint8_t *buf[2];            /* DP_BURST slots of HEADROOM + DP_SLOT */
    struct mmsghdr msg[2][DP_BURST];
    struct iovec iov[2][DP_BURST];
    struct sockaddr_ll from[2][DP_BURST];
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
        s->iov[port][i].iov_base = s->buf[port] + (size_t)i * (HEADROOM + DP_SLOT) + HEADROOM;
        s->iov[port][i].iov_len = DP_SLOT;
        s->msg[port][i].msg_hdr = (struct msghdr){.msg_iov = &s->iov[port][i], .msg_iovlen = 1,
                                                  .msg_name = &s->from[port][i], .msg_namelen = sizeof(struct sockaddr_ll)};
    }
    int n = recvmmsg(s->fd[port], s->msg[port], max, MSG_DONTWAIT, NULL);
    for (int i = 0; i < n; i++) { data[i] = s->iov[port][i].iov_base; len[i] = s->msg[port][i].msg_len; }
    return n;
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
static const backend_t PACKET = {pk_rx, pk_tx, pk_rx_done, pk_idle, pk_close, NULL, NULL};

int io_packet_open(dp_t *dp, const char *ul, const char *ext) {
    pk_t *s = calloc(1, sizeof(pk_t));
    if (!s) return -1;
    s->fd[0] = s->fd[1] = -1;
    dp->bs = s; dp->be = &PACKET;
    const char *names[2] = {ul, ext};
    for (int p = 0; p < 2; p++) {
        s->buf[p] = malloc((size_t)DP_BURST * (HEADROOM + DP_SLOT));
        if (!s->buf[p] || (s->fd[p] = open_packet(names[p], dp->err)) < 0) return -1;
    }
    return 0;
}

