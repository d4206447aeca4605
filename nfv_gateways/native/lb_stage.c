/* Maglev lookup tables (interface and contract in include/tj_lb.h). */
#include <stdlib.h>

#include "tj_bytes.h"
#include "tj_lb.h"

#define SEED_OFFSET 0x9e3779b97f4a7c15ULL
#define SEED_SKIP 0xc2b2ae3d27d4eb4fULL

static int is_prime(uint32_t m) {
    if (m < 2 || (m % 2 == 0 && m != 2)) return 0;
    for (uint32_t f = 3; (uint64_t)f * f <= m; f += 2)
        if (m % f == 0) return 0;
    return 1;
}

typedef struct { uint64_t key; uint32_t index, weight, offset, skip, next; uint64_t target; } entry_t;

static int by_key(const void *a, const void *b) {
    const entry_t *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;  /* equal keys: the caller's order, as Python sorts */
}

int maglev_build(const uint64_t *keys, const uint32_t *weights, uint32_t n, uint32_t m, int32_t *table) {
    if (!is_prime(m)) return -1;
    for (uint32_t i = 0; i < m; i++) table[i] = -1;
    entry_t *e = calloc(n ? n : 1, sizeof(entry_t));
    if (!e) return -1;
    uint32_t live = 0, wmax = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (!weights[i]) continue;
        e[live] = (entry_t){.key = keys[i], .index = i, .weight = weights[i],
                            .offset = mix(keys[i] ^ SEED_OFFSET) % m, .skip = mix(keys[i] ^ SEED_SKIP) % (m - 1) + 1};
        if (weights[i] > wmax) wmax = weights[i];
        live++;
    }
    qsort(e, live, sizeof(entry_t), by_key);
    uint32_t filled = 0;
    for (uint64_t round = 1; live && filled < m; round++) {
        for (uint32_t i = 0; i < live && filled < m; i++) {
            entry_t *x = &e[i];
            if (round * x->weight < x->target) continue;  /* w/W of the rounds */
            x->target += wmax;
            uint32_t c = (uint32_t)((x->offset + (uint64_t)x->next * x->skip) % m);
            while (table[c] >= 0) { x->next++; c = (uint32_t)((x->offset + (uint64_t)x->next * x->skip) % m); }
            table[c] = (int32_t)x->index;
            x->next++;
            filled++;
        }
    }
    free(e);
    return 0;
}

uint32_t maglev_flow_hash(uint32_t src, uint32_t dst, uint16_t sport, uint16_t dport, uint8_t proto) {
    return mix(((uint64_t)src << 32 | dst) ^ ((uint64_t)sport << 48 | (uint64_t)dport << 32 | (uint64_t)proto << 24));
}
