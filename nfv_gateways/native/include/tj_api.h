/* How the native code states its interface once. TJ_API marks a function Python calls: nfv_gateways/native_api.py
 * reads the prototypes so marked from these headers and declares them to ctypes (nothing is retyped by hand).
 * TJ_CONSTANTS lists name/value pairs exported through tj_constants(): Python reads them, never mirrors them. */
#ifndef TJ_API_H
#define TJ_API_H
#include <stdint.h>

#define TJ_API __attribute__((visibility("default")))
#define TJ_ENUM(name, value) name = value,
#define TJ_NAME(name, value) #name,
#define TJ_VALUE(name, value) value,

/* every exported constant: NAT verdicts, the data plane's ports, ring slot size, punt codes */
#define TJ_CONSTANTS(X)                                                                                             \
    X(NAT_MISS, 0) X(NAT_OUT, 1) X(NAT_IN, 2) X(NAT_MAX_PEERS, 4) X(NAT_EVENTS, 1 << 18) X(NAT_EVENT_SIZE, 32)      \
    X(DP_UL, 0) X(DP_EXT, 1) X(DP_SLOT, 4096) X(DP_DPDK_MAX_FRAME, 2048) X(DP_BURST, 64) X(DP_PUNT_TRANSLATED, 0x82)
enum { TJ_CONSTANTS(TJ_ENUM) };

/* the constants' names and values (the arrays stay valid for the library's lifetime); returns how many */
TJ_API uint32_t tj_constants(const char *const **names, const int64_t **values);
#endif
