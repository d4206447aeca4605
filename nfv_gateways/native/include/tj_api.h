/* How the native code states its interface once. The public headers (tj_api.h, tj_nat.h, tj_lb.h, tj_dp.h) hold
 * only what Python calls, each function marked TJ_API, and the structs it passes: nfv_gateways/native/api.py
 * parses them with cffi's C parser and declares every function and struct to ctypes from that (nothing is retyped
 * by hand). What the C files share beyond that lives in the private headers (tj_*_table.h, tj_loop.h).
 * TJ_CONSTANTS lists name/value pairs exported through tj_constants(): Python reads them, never mirrors them. */
#ifndef TJ_API_H
#define TJ_API_H
#include <stdint.h>

#ifndef TJ_API  /* defined empty when the headers are parsed for Python */
#define TJ_API __attribute__((visibility("default")))
#endif
#define TJ_ENUM(name, value) name = value,
#define TJ_NAME(name, value) #name,
#define TJ_VALUE(name, value) value,

/* every exported constant: NAT verdicts and refusals, the service table's refusals, the data plane's ports, ring
 * slot size, punt codes */
#define TJ_CONSTANTS(X)                                                                                             \
    X(NAT_MISS, 0) X(NAT_OUT, 1) X(NAT_IN, 2) X(NAT_MAX_PEERS, 4) X(NAT_NO_PORT, -1) X(NAT_TABLE_FULL, -2)          \
    X(NAT_EXISTS, -3) X(TJ_SVC_OUT_TAKEN, 1) X(TJ_SVC_IN_TAKEN, 2)                                                  \
    X(DP_UL, 0) X(DP_EXT, 1) X(DP_SLOT, 4096) X(DP_DPDK_MAX_FRAME, 2048) X(DP_BURST, 64) X(DP_PUNT_TRANSLATED, 0x82)
enum { TJ_CONSTANTS(TJ_ENUM) };

/* the constants' names and values (the arrays stay valid for the library's lifetime); returns how many */
TJ_API uint32_t tj_constants(const char *const **names, const int64_t **values);
#endif
