/* Rings between the packet loop and Python: punted frames out, injected frames in. */
#include <stdlib.h>
#include <string.h>

#include "tj_loop.h"

int ring_init(ring_t *r) {
    r->slots = calloc(RING, sizeof(slot_t));
    r->head = r->tail = 0;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    return r->slots ? 0 : -1;
}

void ring_free(ring_t *r) { free(r->slots); r->slots = NULL; }

int ring_push(ring_t *r, uint8_t port, const uint8_t *d, uint32_t len) {
    if (len > DP_SLOT) len = DP_SLOT;
    pthread_mutex_lock(&r->mu);
    if (r->tail - r->head >= RING) { pthread_mutex_unlock(&r->mu); return -1; }
    slot_t *s = &r->slots[r->tail % RING];
    s->port = port; s->len = (uint16_t)len; memcpy(s->data, d, len);
    r->tail++;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return 0;
}

int ring_take(ring_t *r, uint8_t *bufs, uint32_t *lens, uint8_t *ports, uint32_t max) {
    uint32_t n = 0;
    for (; r->head != r->tail && n < max; r->head++, n++) {
        slot_t *s = &r->slots[r->head % RING];
        memcpy(bufs + (size_t)n * DP_SLOT, s->data, s->len);
        lens[n] = s->len; ports[n] = s->port;
    }
    return (int)n;
}
