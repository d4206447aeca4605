/* A small open-addressing map u64 -> u64 for the data plane's config (VTEPs, routers, endpoints, neighbours).
 * Key 0 is the empty slot: callers tag their keys (ip | 1 << 32, or + 1) so that no real key is 0. */
#ifndef TJ_MAP_H
#define TJ_MAP_H
#include <stdlib.h>

#include "tj_bytes.h"

typedef struct { uint32_t cap; uint64_t *keys, *vals; } map_t;

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
        if (m->keys[i] == 0 || m->keys[i] == k) { m->keys[i] = k; m->vals[i] = v; return 0; }
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
#endif
