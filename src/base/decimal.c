#include "decimal.h"

int fsdp_plain_decimal(const char *s, int real) {
    const char *p = s + (*s == '+' || *s == '-');
    int digits = 0;
    while (*p >= '0' && *p <= '9') p++, digits++;
    if (real && *p == '.')
        for (p++; *p >= '0' && *p <= '9'; p++) digits++;
    if (!digits) return 0;
    if (real && (*p == 'e' || *p == 'E')) {
        p++;
        p += *p == '+' || *p == '-';
        if (!(*p >= '0' && *p <= '9')) return 0;
        while (*p >= '0' && *p <= '9') p++;
    }
    return *p == 0;
}
