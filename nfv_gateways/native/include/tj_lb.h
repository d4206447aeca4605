/* The load balancer's stage: Maglev consistent hashing (Eisenbud et al., NSDI 2016), weighted.
 *
 * A pool's lookup table is a deterministic function of its members' keys and weights and the table size M (a
 * prime): every instance builds the identical table, so whichever instance a flow's packets reach picks the same
 * member. Members are taken in the order of their keys (not the caller's), each with its own permutation of the
 * table (offset = h1(key) mod M, skip = h2(key) mod (M - 1) + 1), and in each round a member of weight w claims its
 * next free preferred entry w/W of the time (W: the largest weight; Envoy's weighted Maglev); weight 0 members get
 * none (draining). nfv_gateways/maglev.py is the same in Python, and tests hold the two to identical tables. */
#ifndef TJ_LB_H
#define TJ_LB_H
#include <stdint.h>

#include "tj_api.h"

/* Fill table[m] with indices into keys/weights (-1 everywhere when no member has weight); 0, or -1 when m is not a
 * prime or memory runs out. */
TJ_API int maglev_build(const uint64_t *keys, const uint32_t *weights, uint32_t n, uint32_t m, int32_t *table);
/* The 5-tuple's hash that indexes a table (mod m): the same in every instance. */
TJ_API uint32_t maglev_flow_hash(uint32_t src, uint32_t dst, uint16_t sport, uint16_t dport, uint8_t proto);
#endif
