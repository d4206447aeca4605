/* Traffic generator for bench/lb.py: one template frame (Ethernet, maybe VXLAN, then the IPv4 packet whose
 * source varies), sent as fast as AF_PACKET sendmmsg allows (qdisc bypassed) for a number of seconds.
 *
 *   lbgen IFNAME SECONDS FRAMEFILE IPOFF MODE N [PPS]
 *
 *   IPOFF  offset of the varying IPv4 header in the frame (14, or 64 inside VXLAN)
 *   MODE   flows: N flows, the source port cycling over N values (established traffic)
 *          new:   every packet a new 5-tuple (the source address and port counting up: new connections)
 *   PPS    at most this many packets per second (default: as fast as it goes)
 * Both rewrite the IPv4 and TCP/UDP checksums per packet. Prints: packets sent, seconds. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#define BATCH 64
#define FLOWS_MAX 65536

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

static uint16_t fold(uint32_t s) {
    while (s >> 16) s = (s & 0xffff) + (s >> 16);
    return (uint16_t)~s;
}

static uint32_t sum16(const uint8_t *p, size_t n, uint32_t s) {
    for (size_t i = 0; i + 1 < n; i += 2) s += (uint32_t)(p[i] << 8 | p[i + 1]);
    if (n & 1) s += (uint32_t)(p[n - 1] << 8);
    return s;
}

/* the source address and port of the packet at ip, then both checksums */
static void vary(uint8_t *ip, uint32_t src, uint16_t sport) {
    size_t ihl = (size_t)(ip[0] & 0x0f) * 4, total = (size_t)(ip[2] << 8 | ip[3]);
    uint8_t *l4 = ip + ihl;
    ip[12] = src >> 24; ip[13] = src >> 16; ip[14] = src >> 8; ip[15] = src;
    l4[0] = sport >> 8; l4[1] = sport;
    ip[10] = ip[11] = 0;
    uint16_t c = fold(sum16(ip, ihl, 0));
    ip[10] = c >> 8; ip[11] = c;
    size_t len = total - ihl, at = ip[9] == 6 ? 16 : 6;
    l4[at] = l4[at + 1] = 0;
    uint32_t s = sum16(ip + 12, 8, 0) + ip[9] + (uint32_t)len;
    c = fold(sum16(l4, len, s));
    if (ip[9] == 17 && c == 0) c = 0xffff;
    l4[at] = c >> 8; l4[at + 1] = c;
}

int main(int argc, char **argv) {
    if (argc != 7 && argc != 8) {
        fprintf(stderr, "usage: lbgen IFNAME SECONDS FRAMEFILE IPOFF flows|new N [PPS]\n");
        return 2;
    }
    double pps = argc == 8 ? atof(argv[7]) : 0;
    FILE *f = fopen(argv[3], "rb");
    if (!f) { perror("frame"); return 1; }
    static uint8_t tmpl[2048];
    size_t len = fread(tmpl, 1, sizeof tmpl, f);
    fclose(f);
    size_t ipoff = (size_t)atoi(argv[4]);
    int fresh = !strcmp(argv[5], "new");
    uint32_t n = (uint32_t)atol(argv[6]);
    if (len < ipoff + 28 || !n) { fprintf(stderr, "bad frame or count\n"); return 2; }
    /* flows: every flow's frame built once (up to FLOWS_MAX), sent round-robin untouched; new: BATCH frames
     * rewritten before each send */
    uint32_t nbuf = fresh ? BATCH : (n < FLOWS_MAX ? n : FLOWS_MAX);
    uint8_t (*bufs)[2048] = calloc(nbuf < BATCH ? BATCH : nbuf, 2048);
    struct iovec *iov = calloc(nbuf < BATCH ? BATCH : nbuf, sizeof *iov);
    struct mmsghdr m[BATCH];
    if (!bufs || !iov) { perror("calloc"); return 1; }
    for (uint32_t i = 0; i < nbuf; i++) {
        memcpy(bufs[i], tmpl, len);
        iov[i] = (struct iovec){.iov_base = bufs[i], .iov_len = len};
    }
    int fd = socket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL)), one = 1;
    setsockopt(fd, SOL_PACKET, PACKET_QDISC_BYPASS, &one, sizeof one);
    struct sockaddr_ll sll = {.sll_family = AF_PACKET, .sll_ifindex = (int)if_nametoindex(argv[1])};
    if (fd < 0 || bind(fd, (struct sockaddr *)&sll, sizeof sll) < 0) { perror("socket"); return 1; }
    const uint8_t *t = tmpl + ipoff;
    uint32_t base = (uint32_t)(t[12] << 24 | t[13] << 16 | t[14] << 8 | t[15]);
    double end = now() + atof(argv[2]), t0 = now();
    unsigned long long sent = 0, k = 0;
    if (!fresh)
        for (uint32_t i = 0; i < nbuf; i++) vary(bufs[i] + ipoff, base, (uint16_t)(10000 + i));
    while (now() < end) {
        for (int i = 0; i < BATCH; i++, k++) {
            uint32_t b = fresh ? (uint32_t)i : (uint32_t)(k % nbuf);
            if (fresh) vary(bufs[b] + ipoff, base + (uint32_t)(k >> 14), (uint16_t)(1024 + (k & 0x3fff)));
            m[i] = (struct mmsghdr){.msg_hdr = {.msg_iov = &iov[b], .msg_iovlen = 1}};
        }
        int r = sendmmsg(fd, m, BATCH, 0);
        if (r > 0) sent += (unsigned)r;
        while (pps > 0 && sent > (now() - t0) * pps) { /* paced: wait for the clock */ }
    }
    printf("%llu %.3f\n", sent, now() - t0);
    return 0;
}
