/*
 * crc32c.c: CRC32C (Castagnoli), the checksum of every snapshot block: with
 * the SSE4.2 instruction where the processor has it, a table otherwise.
 */
#include "backends/snapshot.h"

#define POLY 0x82f63b78u

static uint32_t table[256];

static void build_table(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
        table[i] = c;
    }
}

static uint32_t crc_table(uint32_t crc, const uint8_t *p, size_t n)
{
    if (!table[1]) build_table();
    while (n--) crc = table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc_sse42(uint32_t crc, const uint8_t *p,
                                                            size_t n)
{
    uint64_t c = crc;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t v;
        __builtin_memcpy(&v, p, 8);
        c = __builtin_ia32_crc32di(c, v);
    }
    crc = (uint32_t)c;
    for (; n > 0; n--) crc = __builtin_ia32_crc32qi(crc, *p++);
    return crc;
}
#endif

uint32_t snap_crc32c(uint32_t crc, const void *data, size_t len)
{
    crc = ~crc;
#if defined(__x86_64__)
    if (__builtin_cpu_supports("sse4.2")) return ~crc_sse42(crc, data, len);
#endif
    return ~crc_table(crc, data, len);
}
