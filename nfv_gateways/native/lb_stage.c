/* Maglev lookup tables (interface and contract in include/tj_lb.h). */
#include <stdlib.h>

#include "tj_bytes.h"
#include "tj_lb_table.h"

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

/* --- the connection table ------------------------------------------------------------------------------------ */
#include <pthread.h>
#include <string.h>

#define MAX_POOLS 4096

typedef struct { uint32_t pool, vni, src, dst; uint16_t sport, dport; uint8_t proto, used; uint32_t member;
                 double deadline; } conn_t;
typedef struct { int32_t *table; uint32_t m, n; uint32_t *ids; double idle; int set; } pool_t;

struct lb {
    uint32_t cap, count, tombs;
    conn_t *slots;                 /* open addressing; used: 0 empty, 1 live, 2 deleted */
    pool_t pools[MAX_POOLS];
    double rate, tokens, at; uint32_t burst;
    uint64_t hits, fresh, fallback, misses;
    pthread_mutex_t mu;
};

lb_t *lb_create(uint32_t cap_pow2, double new_per_s, uint32_t burst) {
    lb_t *lb = calloc(1, sizeof(lb_t));
    if (!lb) return NULL;
    lb->slots = calloc(cap_pow2, sizeof(conn_t));
    if (!lb->slots) { free(lb); return NULL; }
    lb->cap = cap_pow2; lb->rate = new_per_s; lb->burst = burst; lb->tokens = burst; lb->at = 0;
    pthread_mutex_init(&lb->mu, NULL);
    return lb;
}

void lb_destroy(lb_t *lb) {
    if (!lb) return;
    for (uint32_t i = 0; i < MAX_POOLS; i++) { free(lb->pools[i].table); free(lb->pools[i].ids); }
    free(lb->slots);
    free(lb);
}

int lb_set_pool(lb_t *lb, uint32_t pool, const int32_t *table, uint32_t m, const uint32_t *ids, uint32_t n,
                double idle_s) {
    if (pool >= MAX_POOLS) return -1;
    int32_t *t = malloc(sizeof(int32_t) * (m ? m : 1));
    uint32_t *d = malloc(sizeof(uint32_t) * (n ? n : 1));
    if (!t || !d) { free(t); free(d); return -1; }
    memcpy(t, table, sizeof(int32_t) * m);
    memcpy(d, ids, sizeof(uint32_t) * n);
    pthread_mutex_lock(&lb->mu);
    pool_t *p = &lb->pools[pool];
    free(p->table); free(p->ids);
    *p = (pool_t){.table = t, .m = m, .n = n, .ids = d, .idle = idle_s, .set = 1};
    pthread_mutex_unlock(&lb->mu);
    return 0;
}

static uint32_t conn_hash(uint32_t pool, uint32_t vni, uint32_t src, uint32_t dst, uint16_t sport, uint16_t dport,
                          uint8_t proto) {
    return mix(((uint64_t)pool << 40 ^ (uint64_t)vni << 8 ^ proto) ^ mix((uint64_t)src << 32 | dst) ^
               ((uint64_t)sport << 16 | dport) << 24);
}

static int has_member(const pool_t *p, uint32_t id) {
    for (uint32_t i = 0; i < p->n; i++) if (p->ids[i] == id) return 1;
    return 0;
}

static int take_token(lb_t *lb, double now) {
    double level = lb->tokens + (now - lb->at) * lb->rate;
    if (level > (double)lb->burst) level = (double)lb->burst;
    lb->tokens = level; lb->at = now;
    if (lb->tokens >= 1) { lb->tokens -= 1; return 1; }
    return 0;
}

int64_t lb_pick_locked(lb_t *lb, uint32_t pool, uint32_t vni, uint32_t src, uint32_t dst, uint16_t sport,
                     uint16_t dport, uint8_t proto, double now) {
    if (pool >= MAX_POOLS || !lb->pools[pool].set) { lb->misses++; return -1; }
    pool_t *p = &lb->pools[pool];
    uint32_t mask = lb->cap - 1, i = conn_hash(pool, vni, src, dst, sport, dport, proto) & mask, free_at = lb->cap;
    for (uint32_t k = 0; k < lb->cap; k++, i = (i + 1) & mask) {
        conn_t *c = &lb->slots[i];
        if (c->used == 0) { if (free_at == lb->cap) free_at = i; break; }
        if (c->used == 2) { if (free_at == lb->cap) free_at = i; continue; }
        if (c->pool == pool && c->vni == vni && c->src == src && c->dst == dst && c->sport == sport &&
            c->dport == dport && c->proto == proto) {
            if (now <= c->deadline && has_member(p, c->member)) {
                c->deadline = now + p->idle;
                lb->hits++;
                return c->member;
            }
            c->used = 2;  /* idle too long, or its member is gone: decided afresh */
            lb->count--;
            lb->tombs++;
            if (free_at == lb->cap) free_at = i;
            break;
        }
    }
    int32_t idx = p->m ? p->table[maglev_flow_hash(src, dst, sport, dport, proto) % p->m] : -1;
    if (idx < 0 || (uint32_t)idx >= p->n) { lb->misses++; return -1; }
    uint32_t member = p->ids[idx];
    if (free_at < lb->cap && lb->count < lb->cap / 4 * 3 && take_token(lb, now)) {
        if (lb->slots[free_at].used == 2) lb->tombs--;
        lb->slots[free_at] = (conn_t){.pool = pool, .vni = vni, .src = src, .dst = dst, .sport = sport,
                                      .dport = dport, .proto = proto, .used = 1, .member = member,
                                      .deadline = now + p->idle};
        lb->count++;
        lb->fresh++;
    } else {
        lb->fallback++;
    }
    return member;
}

int64_t lb_pick(lb_t *lb, uint32_t pool, uint32_t vni, uint32_t src, uint32_t dst, uint16_t sport, uint16_t dport,
                uint8_t proto, double now) {
    pthread_mutex_lock(&lb->mu);
    int64_t r = lb_pick_locked(lb, pool, vni, src, dst, sport, dport, proto, now);
    pthread_mutex_unlock(&lb->mu);
    return r;
}

void lb_lock(lb_t *lb) { pthread_mutex_lock(&lb->mu); }
void lb_unlock(lb_t *lb) { pthread_mutex_unlock(&lb->mu); }

/* deleted slots lengthen every probe: past a quarter of the table, put the live entries back in a clean one */
static void compact(lb_t *lb) {
    conn_t *fresh = calloc(lb->cap, sizeof(conn_t));
    if (!fresh) return;  /* no memory: probes stay long, nothing is lost */
    uint32_t mask = lb->cap - 1;
    for (uint32_t i = 0; i < lb->cap; i++) {
        conn_t *c = &lb->slots[i];
        if (c->used != 1) continue;
        uint32_t j = conn_hash(c->pool, c->vni, c->src, c->dst, c->sport, c->dport, c->proto) & mask;
        while (fresh[j].used) j = (j + 1) & mask;
        fresh[j] = *c;
    }
    free(lb->slots);
    lb->slots = fresh;
    lb->tombs = 0;
}

uint32_t lb_expire(lb_t *lb, double now) {
    uint32_t n = 0;
    pthread_mutex_lock(&lb->mu);
    for (uint32_t i = 0; i < lb->cap; i++)
        if (lb->slots[i].used == 1 && now > lb->slots[i].deadline) {
            lb->slots[i].used = 2; lb->count--; lb->tombs++; n++;
        }
    if (lb->tombs > lb->cap / 4) compact(lb);
    pthread_mutex_unlock(&lb->mu);
    return n;
}

void lb_stats(lb_t *lb, uint64_t *out5) {
    out5[0] = lb->hits; out5[1] = lb->fresh; out5[2] = lb->fallback; out5[3] = lb->misses; out5[4] = lb->count;
}
