/* The NAT's policy, per VPC (interface in include/tj_nat.h): each VPC's record is replaced alone, and the lookups
 * the packet path makes across VPCs (1:1 EIPs both ways, DNAT'd ports and their targets, the EIPs served) are
 * kept by adding and removing that VPC's keys, so that a change to one tenant costs that tenant. Keys several
 * VPCs could share are reference-counted. */
#include <stdint.h>
#include <string.h>

#include "tj_nat_table.h"

static uint64_t dnat_in_key(uint32_t eip, uint16_t port, uint8_t proto) {
    return TAG | (uint64_t)eip << 24 | (uint64_t)port << 8 | proto;
}

static void unref(map_t *m, uint64_t k) {
    uint64_t refs;
    if (!map_get(m, k, &refs)) return;
    if (refs > 1) map_put(m, k, refs - 1);
    else map_del(m, k);
}
static void ref(map_t *m, uint64_t k) {
    uint64_t refs = 0;
    map_get(m, k, &refs);
    map_put(m, k, refs + 1);  /* room was reserved */
}

static void vpc_free(vpc_nat_t *v) {
    if (!v) return;
    free(v->snat); free(v->eips); free(v->statics); free(v->dnat); free(v);
}

static void *copy(const void *src, size_t size) {
    void *d = malloc(size ? size : 1);
    if (d && size) memcpy(d, src, size);
    return d;
}

static vpc_nat_t *vpc_copy(const tj_nat_vpc_t *in) {
    vpc_nat_t *v = calloc(1, sizeof *v);
    if (!v) return NULL;
    *v = (vpc_nat_t){in->vni, in->mtu, in->nsnat, in->neips, in->nstatic, in->ndnat, NULL, NULL, NULL, NULL};
    v->snat = copy(in->snat, sizeof(tj_snat_rule_t) * in->nsnat);
    v->eips = copy(in->eips, sizeof(uint32_t) * in->neips);
    v->statics = copy(in->statics, sizeof(tj_static_eip_t) * in->nstatic);
    v->dnat = copy(in->dnat, sizeof(tj_dnat_rule_t) * in->ndnat);
    if (!v->snat || !v->eips || !v->statics || !v->dnat) { vpc_free(v); return NULL; }
    for (uint32_t i = 0; i < v->nsnat; i++)  /* a rule naming EIPs past the list names none */
        if (v->snat[i].first > v->neips || v->snat[i].neips > v->neips - v->snat[i].first) v->snat[i].neips = 0;
    return v;
}

static void index_vpc(nat_t *n, const vpc_nat_t *v, int add) {
    void (*op)(map_t *, uint64_t) = add ? ref : unref;
    for (uint32_t i = 0; i < v->nstatic; i++) {
        const tj_static_eip_t *s = &v->statics[i];
        if (add) {
            map_put(n->static_in, TAG | (uint64_t)v->vni << 32 | s->ip, s->eip);
            map_put(n->static_out, s->eip | 1ULL << 32, (uint64_t)v->vni << 32 | s->ip);
        } else {
            map_del(n->static_in, TAG | (uint64_t)v->vni << 32 | s->ip);
            map_del(n->static_out, s->eip | 1ULL << 32);
        }
        op(n->served, s->eip | 1ULL << 32);
    }
    for (uint32_t i = 0; i < v->ndnat; i++) {
        const tj_dnat_rule_t *d = &v->dnat[i];
        op(n->dnat_in, dnat_in_key(d->eip, d->port, d->proto));
        op(n->dnat_out, dnat_out_key(v->vni, d->ip, d->iport, d->proto));
        op(n->served, d->eip | 1ULL << 32);
    }
    for (uint32_t i = 0; i < v->neips; i++) op(n->served, v->eips[i] | 1ULL << 32);
}

static int set_vpc_(nat_t *n, const tj_nat_vpc_t *in) {
    vpc_nat_t *v = vpc_copy(in);
    if (!v) return -1;
    uint32_t keys = v->nstatic + v->ndnat + v->neips;
    if (map_reserve(&n->vpcs, 1) || map_reserve(&n->static_in, v->nstatic) ||
        map_reserve(&n->static_out, v->nstatic) || map_reserve(&n->dnat_in, v->ndnat) ||
        map_reserve(&n->dnat_out, v->ndnat) || map_reserve(&n->served, keys)) {
        vpc_free(v);
        return -1;
    }
    vpc_nat_t *old = (vpc_nat_t *)nat_vpc(n, v->vni);
    if (old) index_vpc(n, old, 0);
    index_vpc(n, v, 1);
    map_put(n->vpcs, v->vni | 1ULL << 32, (uint64_t)(uintptr_t)v);
    vpc_free(old);
    return 0;
}

static int remove_vpc_(nat_t *n, uint32_t vni) {
    vpc_nat_t *old = (vpc_nat_t *)nat_vpc(n, vni);
    if (!old) return -1;
    index_vpc(n, old, 0);
    map_del(n->vpcs, vni | 1ULL << 32);
    vpc_free(old);
    return 0;
}

int nat_set_vpc(nat_t *n, const tj_nat_vpc_t *vpc) { LOCKED(n, set_vpc_(n, vpc)); }
int nat_remove_vpc(nat_t *n, uint32_t vni) { LOCKED(n, remove_vpc_(n, vni)); }
uint32_t nat_vpc_count(nat_t *n) { LOCKED(n, n->vpcs ? n->vpcs->n : 0); }

void nat_vpcs_free(nat_t *n) {
    for (uint32_t i = 0; n->vpcs && i < n->vpcs->cap; i++)
        if (n->vpcs->keys[i]) vpc_free((vpc_nat_t *)(uintptr_t)n->vpcs->vals[i]);
    map_free(n->vpcs); map_free(n->static_in); map_free(n->static_out); map_free(n->dnat_in); map_free(n->dnat_out);
    map_free(n->served);
    n->vpcs = n->static_in = n->static_out = n->dnat_in = n->dnat_out = n->served = NULL;
}
