/* Byte-order access, Internet checksums and the hash every table uses: the arithmetic nfv_gateways/core/packet.py and
 * core/underlay.py do in Python, written once for every C file. */
#ifndef TJ_BYTES_H
#define TJ_BYTES_H
#include <stdint.h>

static inline uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }
static inline uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static inline void wr16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)(v >> 8); p[1] = (uint8_t)v; }
static inline void wr32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16); p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
}

/* the 64-bit finaliser of MurmurHash3, truncated to 32 bits (underlay.py's mix) */
static inline uint32_t mix(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL; x ^= x >> 33;
    return (uint32_t)x;
}

static inline uint16_t csum(const uint8_t *d, uint32_t len) {
    uint32_t s = 0;
    for (uint32_t i = 0; i + 1 < len; i += 2) s += rd16(d + i);
    if (len & 1) s += (uint32_t)d[len - 1] << 8;
    while (s >> 16) s = (s & 0xffff) + (s >> 16);
    return (uint16_t)~s;
}
/* RFC 1624 incremental update of a checksum when one 16-bit word changes */
static inline uint16_t upd16(uint16_t sum, uint16_t old, uint16_t new_) {
    uint32_t s = (uint32_t)(~sum & 0xffff) + (uint32_t)(~old & 0xffff) + new_;
    while (s >> 16) s = (s & 0xffff) + (s >> 16);
    return (uint16_t)~s;
}
static inline uint16_t upd32(uint16_t sum, uint32_t old, uint32_t new_) {
    return upd16(upd16(sum, (uint16_t)(old >> 16), (uint16_t)(new_ >> 16)), (uint16_t)old, (uint16_t)new_);
}

static inline uint64_t mac64(const uint8_t *m) {
    return (uint64_t)m[0] << 40 | (uint64_t)m[1] << 32 | (uint64_t)m[2] << 24 | (uint64_t)m[3] << 16 |
           (uint64_t)m[4] << 8 | m[5];
}
static inline void mac_out(uint8_t *d, uint64_t v) { for (int i = 5; i >= 0; i--) { d[i] = (uint8_t)v; v >>= 8; } }
#endif
