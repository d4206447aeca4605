/* Traffic generator for bench/gateway.py: sends pre-built frames round-robin on an interface as fast as
 * AF_PACKET sendmmsg allows (qdisc bypassed), for a number of seconds, and prints how many it sent.
 *
 *   blast IFNAME SECONDS FRAMEFILE      (FRAMEFILE: frames as [u16 big-endian length][bytes]...)
 */
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

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: blast IFNAME SECONDS FRAMEFILE\n"); return 2; }
    FILE *f = fopen(argv[3], "rb");
    if (!f) { perror("frames"); return 1; }
    static uint8_t data[1 << 22];
    size_t size = fread(data, 1, sizeof data, f);
    fclose(f);
    struct iovec *iov = calloc(65536, sizeof *iov);
    size_t n = 0;
    for (size_t off = 0; off + 2 <= size && n < 65536;) {
        uint16_t l = (uint16_t)(data[off] << 8 | data[off + 1]);
        iov[n].iov_base = data + off + 2; iov[n].iov_len = l; n++;
        off += 2 + l;
    }
    if (!n) { fprintf(stderr, "no frames\n"); return 1; }
    int fd = socket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL)), one = 1;
    setsockopt(fd, SOL_PACKET, PACKET_QDISC_BYPASS, &one, sizeof one);
    struct sockaddr_ll sll = {.sll_family = AF_PACKET, .sll_ifindex = (int)if_nametoindex(argv[1])};
    if (fd < 0 || bind(fd, (struct sockaddr *)&sll, sizeof sll) < 0) { perror("socket"); return 1; }
    struct mmsghdr m[BATCH];
    double end = now() + atof(argv[2]), t0 = now();
    unsigned long long sent = 0;
    size_t k = 0;
    while (now() < end) {
        for (int i = 0; i < BATCH; i++, k = (k + 1) % n)
            m[i] = (struct mmsghdr){.msg_hdr = {.msg_iov = &iov[k], .msg_iovlen = 1}};
        int r = sendmmsg(fd, m, BATCH, 0);
        if (r > 0) sent += (unsigned)r;
    }
    printf("%llu %.6f\n", sent, now() - t0);
    return 0;
}
