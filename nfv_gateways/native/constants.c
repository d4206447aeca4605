/* The exported constants (TJ_CONSTANTS in include/tj_api.h), in every library. */
#include "tj_api.h"

static const char *const names[] = {TJ_CONSTANTS(TJ_NAME)};
static const int64_t values[] = {TJ_CONSTANTS(TJ_VALUE)};

uint32_t tj_constants(const char *const **n, const int64_t **v) {
    *n = names; *v = values;
    return sizeof values / sizeof values[0];
}
