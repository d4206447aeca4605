/* A small open-addressing map u64 -> u64 (linear probing) for the data plane's config and the NAT's per-VPC
 * indexes. Key 0 is the empty slot: callers tag their keys (ip | 1 << 32, or + 1) so that no real key is 0.
 * Deletion shifts the probe chain back (no tombstones), so a map that lives long through per-VPC changes stays as
 * fast as a fresh one. */
#ifndef TJ_MAP_H
#define TJ_MAP_H
#include <stdlib.h>

#include "tj_bytes.h"

typedef struct { uint32_t cap, n; uint64_t *keys, *vals; } map_t;

static inline map_t *map_new(uint32_t n) {
    uint32_t cap = 16;
    while (cap < n * 2 + 16) cap <<= 1;
    map_t *m = calloc(1, sizeof(map_t));
    if (!m) return NULL;
    m->cap = cap; m->keys = calloc(cap, 8); m->vals = calloc(cap, 8);
    if (!m->keys || !m->vals) { free(m->keys); free(m->vals); free(m); return NULL; }
    return m;
}
static inline void map_free(map_t *m) { if (m) { free(m->keys); free(m->vals); free(m); } }
/* 0, or -1 when the map is full (a map sized for its entries never is) */
static inline int map_put(map_t *m, uint64_t k, uint64_t v) {
    uint32_t i = mix(k) & (m->cap - 1);
    for (uint32_t n = 0; n < m->cap; n++, i = (i + 1) & (m->cap - 1))
        if (m->keys[i] == 0 || m->keys[i] == k) {
            m->n += m->keys[i] == 0;
            m->keys[i] = k; m->vals[i] = v;
            return 0;
        }
    return -1;
}
static inline int map_get(const map_t *m, uint64_t k, uint64_t *v) {
    if (!m) return 0;
    uint32_t i = mix(k) & (m->cap - 1);
    for (uint32_t n = 0; n < m->cap; n++, i = (i + 1) & (m->cap - 1)) {
        if (m->keys[i] == k) { *v = m->vals[i]; return 1; }
        if (m->keys[i] == 0) return 0;
    }
    return 0;
}
/* remove k; 1 if it was there */
static inline int map_del(map_t *m, uint64_t k) {
    if (!m) return 0;
    uint32_t mask = m->cap - 1, i = mix(k) & mask, n = 0;
    for (; n < m->cap && m->keys[i] != k; n++, i = (i + 1) & mask)
        if (m->keys[i] == 0) return 0;
    if (n == m->cap) return 0;
    for (uint32_t j = i;;) {  /* move back each later entry of the chain whose home is not between the hole and it */
        j = (j + 1) & mask;
        if (m->keys[j] == 0) break;
        uint32_t h = mix(m->keys[j]) & mask;
        if (((j - h) & mask) >= ((j - i) & mask)) { m->keys[i] = m->keys[j]; m->vals[i] = m->vals[j]; i = j; }
    }
    m->keys[i] = 0; m->vals[i] = 0; m->n--;
    return 1;
}
/* room for `extra` more keys in *m (made or grown now), so that a change of several keys cannot fail halfway; 0, or
 * -1 out of memory (*m unchanged) */
static inline int map_reserve(map_t **m, uint32_t extra) {
    uint32_t n = *m ? (*m)->n : 0;
    if (*m && (n + extra) * 2 <= (*m)->cap) return 0;
    map_t *g = map_new(n + extra);
    if (!g) return -1;
    for (uint32_t i = 0; *m && i < (*m)->cap; i++)
        if ((*m)->keys[i]) map_put(g, (*m)->keys[i], (*m)->vals[i]);
    map_free(*m);
    *m = g;
    return 0;
}
/* map_put into *m, made or doubled first when it would be more than half full; 0, or -1 out of memory */
static inline int map_grow_put(map_t **m, uint64_t k, uint64_t v) {
    if (!*m || ((*m)->n + 1) * 2 > (*m)->cap) {
        map_t *g = map_new(*m ? (*m)->cap : 8);
        if (!g) return -1;
        for (uint32_t i = 0; *m && i < (*m)->cap; i++)
            if ((*m)->keys[i]) map_put(g, (*m)->keys[i], (*m)->vals[i]);
        map_free(*m);
        *m = g;
    }
    return map_put(*m, k, v);
}
#endif
