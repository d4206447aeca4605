/* The NAT's mappings (include/tj_nat_table.h): open addressing on the inside key, an index on the outside key,
 * tombstones for deletions until a rehash. No policy, no ports, no lock: its callers hold the table's. */
#include <stdlib.h>
#include <string.h>

#include "tj_nat_table.h"

int nat_table_init(nat_t *n, uint32_t cap_pow2) {
    n->cap = cap_pow2;
    n->slots = calloc(cap_pow2, sizeof(mapping_t));
    n->out_index = malloc(sizeof(int32_t) * cap_pow2);
    if (!n->slots || !n->out_index) { free(n->slots); free(n->out_index); return -1; }
    for (uint32_t i = 0; i < cap_pow2; i++) n->out_index[i] = -1;
    return 0;
}

void nat_table_free(nat_t *n) { free(n->slots); free(n->out_index); }

int32_t nat_find_in(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto) {
    uint32_t m = n->cap - 1, i = h_in(vni, ip, port, proto) & m;
    for (uint32_t k = 0; k < n->cap; k++, i = (i + 1) & m) {
        mapping_t *s = &n->slots[i];
        if (s->used == 0) return -1;
        if (s->used == 1 && s->vni == vni && s->ip == ip && s->port == port && s->proto == proto) return (int32_t)i;
    }
    return -1;
}

int32_t nat_find_out(nat_t *n, uint32_t eip, uint16_t eport, uint8_t proto) {
    uint32_t m = n->cap - 1, i = h_out(eip, eport, proto) & m;
    for (uint32_t k = 0; k < n->cap; k++, i = (i + 1) & m) {
        int32_t idx = n->out_index[i];
        if (idx == -1) return -1;
        if (idx >= 0) {
            mapping_t *s = &n->slots[idx];
            if (s->used == 1 && s->eip == eip && s->eport == eport && s->proto == proto) return idx;
        }
    }
    return -1;
}

/* a mapping's slot (tombstones reused) and its outside index; the keys set, no peers, no TCP state */
static int32_t place(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto, uint32_t eip, uint16_t eport) {
    uint32_t m = n->cap - 1, i = h_in(vni, ip, port, proto) & m, j = h_out(eip, eport, proto) & m;
    while (n->slots[i].used == 1) i = (i + 1) & m;   /* the caller keeps a quarter of the slots free */
    while (n->out_index[j] >= 0) j = (j + 1) & m;
    mapping_t *s = &n->slots[i];
    memset(s, 0, sizeof *s);
    s->vni = vni; s->ip = ip; s->port = port; s->proto = proto; s->eip = eip; s->eport = eport; s->used = 1;
    n->out_index[j] = (int32_t)i;
    n->nused++;
    return (int32_t)i;
}

int32_t nat_insert(nat_t *n, uint32_t vni, uint32_t ip, uint16_t port, uint8_t proto, uint32_t eip, uint16_t eport,
                   double now) {
    if (n->nused >= n->cap / 4 * 3) return -1;  /* fuller, probe chains grow long */
    int32_t idx = place(n, vni, ip, port, proto, eip, eport);
    n->slots[idx].last = now;
    return idx;
}

/* every mapping into fresh slots: deletions leave tombstones, and a lookup that misses walks past them all */
static void rehash(nat_t *n) {
    mapping_t *old = n->slots, *fresh = calloc(n->cap, sizeof(mapping_t));
    if (!fresh) return;  /* still correct, only slower */
    n->slots = fresh;
    for (uint32_t i = 0; i < n->cap; i++) n->out_index[i] = -1;
    n->nused = n->ndel = 0;
    for (uint32_t i = 0; i < n->cap; i++) {
        if (old[i].used != 1) continue;
        mapping_t *s = &n->slots[place(n, old[i].vni, old[i].ip, old[i].port, old[i].proto, old[i].eip,
                                       old[i].eport)];
        *s = old[i];
    }
    free(old);
}

void nat_remove(nat_t *n, int32_t idx) {
    mapping_t *s = &n->slots[idx];
    uint32_t m = n->cap - 1, j = h_out(s->eip, s->eport, s->proto) & m;
    for (uint32_t k = 0; k < n->cap; k++, j = (j + 1) & m)
        if (n->out_index[j] == idx) { n->out_index[j] = -2; break; }
    s->used = 2; /* tombstone keeps probe chains intact */
    n->nused--;
    n->ndel++;
}

void nat_compact(nat_t *n) {
    if (n->ndel > n->cap / 4) rehash(n);
}

int nat_has_peer(const mapping_t *s, uint32_t ip, uint16_t port) {
    for (uint8_t p = 0; p < s->npeers; p++) if (s->peer_ip[p] == ip && s->peer_port[p] == port) return 1;
    return 0;
}
