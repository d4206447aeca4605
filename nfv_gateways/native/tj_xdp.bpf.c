/* The XDP flow cache (include/tj_xdp.h): two programs, one per port of an instance. A packet whose flow has an
 * entry is rewritten as the loop rewrote its first ones and sent on from here; everything else goes to the loop's
 * AF_XDP socket (slot 0 of `xsks`), or to the kernel when no socket is bound. Built with clang -target bpf. */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "tj_xdp.h"

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, TJ_XDP_FLOWS);
    __uint(map_flags, BPF_F_NO_PREALLOC);
    __type(key, struct tj_flow_key);
    __type(value, struct tj_flow_act);
} flows SEC(".maps");

struct {  /* what an entry's epoch must be (tj_flow_act.epoch) */
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, __u32);
} epoch SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_XSKMAP);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, __u32);
} xsks SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, __u64);
} carried SEC(".maps");

static __always_inline __u16 fold(__u32 s) {
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    return (__u16)s;
}

/* the one's-complement sum of a 20-byte IPv4 header (0xffff when its checksum is right) */
static __always_inline __u16 ip_sum(const __u16 *h) {
    __u32 s = 0;
#pragma unroll
    for (int i = 0; i < 10; i++) s += h[i];
    return fold(s);
}

/* RFC 1624: a 16-bit word of a checksummed area changed from `old` to `new` */
static __always_inline __u32 csum_add(__u32 s, __u16 old, __u16 new_) { return s + (__u16)~old + new_; }

static __always_inline int to_loop(void) { return bpf_redirect_map(&xsks, 0, XDP_PASS); }

/* the flow's entry, if it has one of the port's current epoch */
static __always_inline struct tj_flow_act *entry(const struct tj_flow_key *k) {
    __u32 zero = 0, *now = bpf_map_lookup_elem(&epoch, &zero);
    struct tj_flow_act *a = bpf_map_lookup_elem(&flows, k);
    return a && now && a->epoch == *now ? a : 0;
}

/* the inner IPv4 packet at ip (of a frame ending at end) that the cache may carry: its key filled; 0 if not */
static __always_inline int inner_flow(struct iphdr *ip, void *end, struct tj_flow_key *k) {
    if ((void *)(ip + 1) > end || ip->version != 4 || ip->ihl != 5 || ip->ttl <= 1) return 0;
    if (ip->frag_off & bpf_htons(0x3fff) || ip_sum((const __u16 *)ip) != 0xffff) return 0;
    __u16 total = bpf_ntohs(ip->tot_len);
    if ((void *)ip + total > end) return 0;
    void *l4 = (void *)(ip + 1);
    if (ip->protocol == IPPROTO_TCP) {
        struct tcphdr *t = l4;
        if ((void *)(t + 1) > end || total < 40 || t->doff < 5 || t->doff * 4 > total - 20) return 0;
        if (t->syn || t->fin || t->rst) return 0;
        k->sport = t->source; k->dport = t->dest;
    } else if (ip->protocol == IPPROTO_UDP) {
        struct udphdr *u = l4;
        if ((void *)(u + 1) > end || total < 28) return 0;
        k->sport = u->source; k->dport = u->dest;
    } else {
        return 0;
    }
    k->src = ip->saddr; k->dst = ip->daddr; k->proto = ip->protocol;
    return 1;
}

/* the entry's rewrite of the inner packet: addresses and ports (TJ_XDP_NAT), TTL (TJ_XDP_TTL), their checksums */
static __always_inline int rewrite(struct iphdr *ip, void *end, const struct tj_flow_act *a) {
    if (a->flags & TJ_XDP_NAT) {
        void *l4 = (void *)(ip + 1);
        __u16 *ports = l4, *sum;
        if (ip->protocol == IPPROTO_TCP) {
            struct tcphdr *t = l4;
            if ((void *)(t + 1) > end) return 0;
            sum = &t->check;
        } else {
            struct udphdr *u = l4;
            if ((void *)(u + 1) > end) return 0;
            sum = &u->check;
        }
        if (ip->protocol == IPPROTO_TCP || *sum) {
            __u32 s = (__u16)~*sum;
            s = csum_add(s, (__u16)ip->saddr, (__u16)a->src);
            s = csum_add(s, (__u16)(ip->saddr >> 16), (__u16)(a->src >> 16));
            s = csum_add(s, (__u16)ip->daddr, (__u16)a->dst);
            s = csum_add(s, (__u16)(ip->daddr >> 16), (__u16)(a->dst >> 16));
            s = csum_add(s, ports[0], a->sport);
            s = csum_add(s, ports[1], a->dport);
            __u16 c = ~fold(s);
            *sum = (ip->protocol == IPPROTO_UDP && c == 0) ? 0xffff : c;
        }
        ports[0] = a->sport; ports[1] = a->dport;
        ip->saddr = a->src; ip->daddr = a->dst;
    }
    if (a->flags & TJ_XDP_TTL) ip->ttl--;
    if (a->flags & (TJ_XDP_NAT | TJ_XDP_TTL)) {
        ip->check = 0;
        ip->check = ~ip_sum((const __u16 *)ip);
    }
    return 1;
}

/* after the rewrite: the frame (`hdr` bytes before its IPv4 packet of `total`) trimmed to its packet (TJ_XDP_TRIM),
 * decapsulated or untagged, encapsulated or tagged, sent */
static __always_inline int forward(struct xdp_md *ctx, struct tj_flow_act *a, __u32 hdr, __u32 total) {
    void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
    int extra = (int)(end - data) - (int)(hdr + total);
    if (a->flags & TJ_XDP_TRIM && extra > 0 && bpf_xdp_adjust_tail(ctx, -extra)) return XDP_DROP;
    int tag = a->flags & TJ_XDP_PUSH_TAG ? TJ_XDP_TAG : 0;
    /* what goes before the new Ethernet header: off with the old one (and its tag, or VXLAN), on with ours */
    int head = (int)hdr - 14 - (a->encap ? TJ_XDP_ENCAP : 0) - tag;
    if (head && bpf_xdp_adjust_head(ctx, head)) return XDP_DROP;
    data = (void *)(long)ctx->data; end = (void *)(long)ctx->data_end;
    __u8 *e = data;
    if (a->encap) {
        if ((void *)(e + TJ_XDP_ENCAP + 14) > end) return XDP_DROP;
        __builtin_memcpy(e, a->outer, TJ_XDP_ENCAP);
        struct iphdr *o = (void *)(e + 14);
        __u16 inner = (__u16)(end - data) - TJ_XDP_ENCAP;   /* the inner frame */
        o->tot_len = bpf_htons(inner + TJ_XDP_ENCAP - 14);
        o->check = 0;
        o->check = ~ip_sum((const __u16 *)o);
        struct udphdr *u = (void *)(o + 1);
        u->len = bpf_htons(inner + TJ_XDP_ENCAP - 34);
        e += TJ_XDP_ENCAP;
    }
    if ((void *)(e + 14 + TJ_XDP_TAG) > end) return XDP_DROP;
    __builtin_memcpy(e, a->eth, 12);
    if (tag) {  /* the packet's own EtherType (IPv4) follows, where it was */
        *(__u16 *)(e + 12) = bpf_htons(ETH_P_8021Q);
        *(__u16 *)(e + 14) = a->tci;
    }
    a->last_ns = bpf_ktime_get_ns();
    __u32 zero = 0;
    __u64 *n = bpf_map_lookup_elem(&carried, &zero);
    if (n) (*n)++;
    return a->tx ? XDP_TX : bpf_redirect(a->ifindex, 0);
}

static __always_inline int same_mac(const __u8 *a, const __u8 *b) {
    return *(const __u32 *)a == *(const __u32 *)b && *(const __u16 *)(a + 4) == *(const __u16 *)(b + 4);
}

/* the underlay port: VXLAN to our VTEP, from the flow's hypervisor, in its VNI */
SEC("xdp")
int tj_xdp_ul(struct xdp_md *ctx) {
    void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    struct iphdr *o = (void *)(eth + 1);
    struct udphdr *u = (void *)(o + 1);
    __u8 *vx = (void *)(u + 1);
    struct ethhdr *ie = (void *)(vx + 8);
    struct iphdr *ip = (void *)(ie + 1);
    if ((void *)(ip + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP)) return to_loop();
    if (o->version != 4 || o->ihl != 5) return to_loop();
    if (o->protocol != IPPROTO_UDP || o->frag_off & bpf_htons(0x3fff) || u->dest != bpf_htons(4789)) return to_loop();
    if (!(vx[0] & 0x08) || ie->h_proto != bpf_htons(ETH_P_IP) || ip_sum((const __u16 *)o) != 0xffff) return to_loop();
    struct tj_flow_key k = {.vtep = o->saddr, .vni = (__u32)vx[4] << 16 | (__u32)vx[5] << 8 | vx[6]};
    if (!inner_flow(ip, end, &k)) return to_loop();
    struct tj_flow_act *a = entry(&k);
    if (!a || o->daddr != a->expect_vtep || !same_mac(eth->h_dest, a->expect_mac)) return to_loop();
    __u16 total = bpf_ntohs(ip->tot_len);
    if (total > a->mtu || !rewrite(ip, end, a)) return to_loop();
    return forward(ctx, a, TJ_XDP_ENCAP + 14, total);
}

/* a port without VXLAN (the external side; a private line's handoff, its frames tagged) */
SEC("xdp")
int tj_xdp_ext(struct xdp_md *ctx) {
    void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    if ((void *)(eth + 1) > end) return to_loop();
    struct tj_flow_key k = {};
    __u32 hdr = 14;
    if (eth->h_proto == bpf_htons(ETH_P_8021Q)) {
        __u16 *tag = (void *)(eth + 1);
        if ((void *)(tag + 2) > end || tag[1] != bpf_htons(ETH_P_IP)) return to_loop();
        k.vni = TJ_XDP_VLAN | (bpf_ntohs(tag[0]) & 0xfff);
        hdr += TJ_XDP_TAG;
    } else if (eth->h_proto != bpf_htons(ETH_P_IP)) {
        return to_loop();
    }
    struct iphdr *ip = data + hdr;
    if (!inner_flow(ip, end, &k)) return to_loop();
    struct tj_flow_act *a = entry(&k);
    if (!a || !same_mac(eth->h_dest, a->expect_mac)) return to_loop();
    __u16 total = bpf_ntohs(ip->tot_len);
    if (total > a->mtu || !rewrite(ip, end, a)) return to_loop();
    return forward(ctx, a, hdr, total);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
