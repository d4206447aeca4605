/* The load balancer's stage: Maglev consistent hashing (Eisenbud et al., NSDI 2016), weighted.
 *
 * A pool's lookup table is a deterministic function of its members' keys and weights and the table size M (a
 * prime): every instance builds the identical table, so whichever instance a flow's packets reach picks the same
 * member. Members are taken in the order of their keys (not the caller's), each with its own permutation of the
 * table (offset = h1(key) mod M, skip = h2(key) mod (M - 1) + 1), and in each round a member of weight w claims its
 * next free preferred entry w/W of the time (W: the largest weight; Envoy's weighted Maglev); weight 0 members get
 * none (draining). nfv_gateways/roles/lb/maglev.py is the same in Python, and tests hold the two to identical tables. */
#ifndef TJ_LB_H
#define TJ_LB_H
#include <stdint.h>

#include "tj_api.h"

/* Fill table[m] with indices into keys/weights (-1 everywhere when no member has weight); 0, or -1 when m is not a
 * prime or memory runs out. */
TJ_API int maglev_build(const uint64_t *keys, const uint32_t *weights, uint32_t n, uint32_t m, int32_t *table);
/* The 5-tuple's hash that indexes a table (mod m): the same in every instance. */
TJ_API uint32_t maglev_flow_hash(uint32_t src, uint32_t dst, uint16_t sport, uint16_t dport, uint8_t proto);

/* An instance's pools and its connection table, so that an established connection keeps its member when the
 * members change. New connections are decided here: a table hit, or the pool's Maglev entry, remembered while the
 * table has room (3/4 of its slots) and the rate of new entries allows (a token bucket: a SYN flood cannot evict
 * or crowd out the established); otherwise the Maglev pick alone (`fallback`), which every instance makes alike.
 * nfv_gateways/roles/lb/reference.py (LbTable) is the same in Python: the differential test holds them to identical picks. */
typedef struct lb lb_t;
TJ_API lb_t *lb_create(uint32_t cap_pow2, double new_per_s, uint32_t burst);
TJ_API void lb_destroy(lb_t *lb);
/* a pool's Maglev table (entries index `ids`), its members' stable ids (draining ones included: their connections
 * go on) and the idle timeout of its connections; replaced whole */
TJ_API int lb_set_pool(lb_t *lb, uint32_t pool, const int32_t *table, uint32_t m, const uint32_t *ids, uint32_t n,
                       double idle_s);
/* the member id for this packet of pool `pool`, or -1 (no member has weight) */
TJ_API int64_t lb_pick(lb_t *lb, uint32_t pool, uint32_t vni, uint32_t src, uint32_t dst, uint16_t sport,
                       uint16_t dport, uint8_t proto, double now);
/* forget connections idle past their pool's timeout; how many */
TJ_API uint32_t lb_expire(lb_t *lb, double now);
/* hits, new (remembered), fallback (not remembered), misses, connections held */
TJ_API void lb_stats(lb_t *lb, uint64_t *out5);
#endif
