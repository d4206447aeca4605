/* New connections through a NAT gateway, for bench/nat_wire.py: a generator on the hypervisor's side and a
 * responder on the internet's, both AF_PACKET with batched system calls.
 *
 *   natgen gen IFNAME SECONDS FRAMEFILE NSRC RATE   (FRAMEFILE: a VXLAN frame carrying a TCP SYN or a UDP datagram to
 *                                                the server, its inner IPv4 header at byte 64)
 *       sends RATE new connections a second (paced: an overloaded gateway's drops would hide its rate): connection k comes from inner source address
 *       base + k % NSRC, port 1024 + k / NSRC % 64512. TCP: a SYN; on the SYN-ACK (through the gateway, in VXLAN)
 *       an ACK and a FIN; on the server's FIN an ACK: the whole exchange crosses the gateway. UDP: one datagram,
 *       and its echo. Prints: connections offered, established (SYN-ACK or echo received), closed, seconds.
 *   natgen respond IFNAME
 *       the server: SYN -> SYN-ACK, FIN -> FIN-ACK, UDP to port 9 -> echo; stateless, until killed.
 * The kernel's own stack is kept off both interfaces by the caller (nftables netdev drops; packet taps see frames
 * before them). */
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
#define IPOFF 64
#define SLOT 2048

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }
static uint32_t rd32(const uint8_t *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }
static void wr16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)(v >> 8); p[1] = (uint8_t)v; }
static void wr32(uint8_t *p, uint32_t v) { wr16(p, (uint16_t)(v >> 16)); wr16(p + 2, (uint16_t)v); }

static uint32_t sum16(const uint8_t *p, size_t n, uint32_t s) {
    for (size_t i = 0; i + 1 < n; i += 2) s += rd16(p + i);
    if (n & 1) s += (uint32_t)p[n - 1] << 8;
    return s;
}
static uint16_t fold(uint32_t s) {
    while (s >> 16) s = (s & 0xffff) + (s >> 16);
    return (uint16_t)~s;
}

/* both checksums of the IPv4 packet at ip (TCP or UDP, no options) */
static void sums(uint8_t *ip) {
    size_t total = rd16(ip + 2), at = ip[9] == 6 ? 16 : 6;
    uint8_t *l4 = ip + 20;
    ip[10] = ip[11] = 0;
    wr16(ip + 10, fold(sum16(ip, 20, 0)));
    l4[at] = l4[at + 1] = 0;
    uint16_t c = fold(sum16(l4, total - 20, sum16(ip + 12, 8, 0) + ip[9] + (uint32_t)(total - 20)));
    wr16(l4 + at, ip[9] == 17 && c == 0 ? 0xffff : c);
}

static int open_port(const char *ifname) {
    int fd = socket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL)), one = 1, big = 32 << 20;
    if (fd < 0) { perror("socket"); exit(1); }
    setsockopt(fd, SOL_PACKET, PACKET_QDISC_BYPASS, &one, sizeof one);
    setsockopt(fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &big, sizeof big);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &big, sizeof big);  /* in flight while the kernel forwards */
    struct sockaddr_ll sll = {.sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_ALL),
                              .sll_ifindex = (int)if_nametoindex(ifname)};
    if (bind(fd, (struct sockaddr *)&sll, sizeof sll) < 0) { perror("bind"); exit(1); }
    return fd;
}

#define TXMAX (3 * BATCH)  /* a batch of new connections and two answers to each reply of a batch */
static uint8_t rx[BATCH][SLOT], tx[TXMAX][SLOT];
static struct iovec rxv[BATCH], txv[TXMAX];
static struct mmsghdr rxm[BATCH], txm[TXMAX];

static int receive(int fd, int flags) {
    for (int i = 0; i < BATCH; i++) {
        rxv[i] = (struct iovec){.iov_base = rx[i], .iov_len = SLOT};
        rxm[i] = (struct mmsghdr){.msg_hdr = {.msg_iov = &rxv[i], .msg_iovlen = 1}};
    }
    int n = recvmmsg(fd, rxm, BATCH, flags, NULL);
    return n < 0 ? 0 : n;
}

static void send_all(int fd, int n) {
    for (int i = 0; i < n; i++) txm[i] = (struct mmsghdr){.msg_hdr = {.msg_iov = &txv[i], .msg_iovlen = 1}};
    for (int done = 0; done < n;) {
        int r = sendmmsg(fd, txm + done, (unsigned)(n - done), 0);
        if (r <= 0) break;  /* the ring is full: what is left is lost, as on a wire */
        done += r;
    }
}

/* --- the server -------------------------------------------------------------------------------------------- */
static int respond(const char *ifname) {
    int fd = open_port(ifname);
    for (;;) {
        int n = receive(fd, 0), k = 0;
        for (int i = 0; i < n; i++) {
            uint8_t *f = rx[i], *ip = f + 14, *l4 = ip + 20;
            uint32_t len = rxm[i].msg_len;
            if (len < 14 + 28 || rd16(f + 12) != 0x0800 || (ip[0] & 0x0f) != 5) continue;
            int tcp = ip[9] == 6 && len >= 14 + 40 && rd16(l4 + 2) == 80, udp = ip[9] == 17 && rd16(l4 + 2) == 9;
            uint8_t flags = tcp ? l4[13] : 0;
            if (!udp && !(tcp && ((flags & 0x12) == 0x02 || (flags & 0x01)))) continue;  /* SYN, FIN, UDP */
            uint8_t *o = tx[k];
            uint32_t olen = 14 + rd16(ip + 2);
            memcpy(o, f + 6, 6); memcpy(o + 6, f, 6); memcpy(o + 12, f + 12, olen - 12);
            uint8_t *oi = o + 14, *ol = oi + 20;
            memcpy(oi + 12, ip + 16, 4); memcpy(oi + 16, ip + 12, 4);
            memcpy(ol, l4 + 2, 2); memcpy(ol + 2, l4, 2);
            oi[8] = 64;
            if (tcp) {
                uint32_t seq = rd32(l4 + 4);
                wr32(ol + 4, flags & 0x02 ? rd32(ip + 12) ^ 0x5eed : rd32(l4 + 8));  /* our ISN, or where we are */
                wr32(ol + 8, seq + 1);
                ol[13] = flags & 0x02 ? 0x12 : 0x11;
            }
            sums(oi);
            txv[k] = (struct iovec){.iov_base = o, .iov_len = olen};
            k++;
        }
        send_all(fd, k);
    }
    return 0;
}

/* --- the hypervisor's side ------------------------------------------------------------------------------------ */
static uint8_t tmpl[SLOT];
static size_t tlen;

/* a frame of the template's outer headers carrying the answer to a reply (inner at IPOFF): from the VM's
 * address and port it arrived at, flags `flags`, seq = its ack, ack = its seq + 1 */
static void answer(uint8_t *o, const uint8_t *reply_ip, uint8_t flags) {
    memcpy(o, tmpl, tlen);
    uint8_t *ip = o + IPOFF, *l4 = ip + 20;
    const uint8_t *rl4 = reply_ip + 20;
    memcpy(ip + 12, reply_ip + 16, 4); memcpy(ip + 16, reply_ip + 12, 4);
    memcpy(l4, rl4 + 2, 2); memcpy(l4 + 2, rl4, 2);
    memcpy(l4 + 4, rl4 + 8, 4);
    wr32(l4 + 8, rd32(rl4 + 4) + 1);
    l4[13] = flags;
    sums(ip);
}

static int generate(const char *ifname, double seconds, const char *framefile, uint32_t nsrc, double rate) {
    FILE *f = fopen(framefile, "rb");
    if (!f) { perror("frame"); return 1; }
    tlen = fread(tmpl, 1, sizeof tmpl, f);
    fclose(f);
    if (tlen < IPOFF + 28 || !nsrc) { fprintf(stderr, "bad frame or source count\n"); return 2; }
    int fd = open_port(ifname), tcp = tmpl[IPOFF + 9] == 6;
    uint32_t base = rd32(tmpl + IPOFF + 12);
    unsigned long long k = 0, established = 0, closed = 0;
    double t0 = now(), end = t0 + seconds, stop = end + 0.5;
    for (double t = t0; t < stop; t = now()) {
        int m = 0, n = receive(fd, MSG_DONTWAIT);  /* the replies first: they finish what was started */
        for (int i = 0; i < n; i++) {
            const uint8_t *fr = rx[i], *ip = fr + IPOFF;
            if (rxm[i].msg_len < IPOFF + 28 || rd16(fr + 12) != 0x0800 || rd16(fr + 36) != 4789 ||
                rd16(fr + IPOFF - 2) != 0x0800 || rd16(ip + 20) != (tcp ? 80 : 9))
                continue;
            if (!tcp) { established++; continue; }
            uint8_t fl = ip[33];
            if ((fl & 0x12) == 0x12) {  /* SYN-ACK: established; ACK it, and close */
                established++;
                answer(tx[m], ip, 0x10); txv[m] = (struct iovec){.iov_base = tx[m], .iov_len = tlen}; m++;
                answer(tx[m], ip, 0x11); txv[m] = (struct iovec){.iov_base = tx[m], .iov_len = tlen}; m++;
            } else if (fl & 0x01) {    /* the server's FIN: the last ACK */
                closed++;
                answer(tx[m], ip, 0x10); txv[m] = (struct iovec){.iov_base = tx[m], .iov_len = tlen}; m++;
            }
        }
        if (t < end && k < (t - t0) * rate)  /* then a batch of new connections, on time */
            for (int j = 0; j < BATCH; j++, m++, k++) {
                memcpy(tx[m], tmpl, tlen);
                uint8_t *ip = tx[m] + IPOFF;
                wr32(ip + 12, base + (uint32_t)(k % nsrc));
                wr16(ip + 20, (uint16_t)(1024 + k / nsrc % 64512));
                if (tcp) wr32(ip + 24, (uint32_t)k * 2654435761u);
                sums(ip);
                txv[m] = (struct iovec){.iov_base = tx[m], .iov_len = tlen};
            }
        send_all(fd, m);
    }
    printf("%llu %llu %llu %.3f\n", k, established, closed, seconds);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "respond")) return respond(argv[2]);
    if (argc == 7 && !strcmp(argv[1], "gen"))
        return generate(argv[2], atof(argv[3]), argv[4], (uint32_t)atol(argv[5]), atof(argv[6]));
    fprintf(stderr, "usage: natgen gen IFNAME SECONDS FRAMEFILE NSRC RATE | natgen respond IFNAME\n");
    return 2;
}
