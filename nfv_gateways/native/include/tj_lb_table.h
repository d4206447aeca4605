/* The load balancer's connection table as the packet loop uses it (not an interface: Python sees tj_lb.h only). */
#ifndef TJ_LB_TABLE_H
#define TJ_LB_TABLE_H
#include "tj_lb.h"

/* the packet loop's form: lb_pick under a lock it holds over a burst */
void lb_lock(lb_t *lb);
void lb_unlock(lb_t *lb);
int64_t lb_pick_locked(lb_t *lb, uint32_t pool, uint32_t vni, uint32_t src, uint32_t dst, uint16_t sport,
                       uint16_t dport, uint8_t proto, double now);
#endif
