/* SPDX-License-Identifier: MIT */
/*
 * crc32c.c: CRC32C (Castagnoli), the checksum of every snapshot block: with
 * the processor's CRC32C instructions where it has them (SSE4.2 on x86-64,
 * the CRC extension on ARMv8), a table otherwise. The table is a constant
 * computed by the compiler: nothing is built at run time, so threads that
 * use it first at once cannot see it half-made.
 */
#include "backends/checkpoint/snapshot.h"

#if defined(__aarch64__)
#include <arm_acle.h>
#include <sys/auxv.h>
#ifndef HWCAP_CRC32
#define HWCAP_CRC32 (1u << 7)
#endif
#endif

#define POLY 0x82f63b78u

/* One bit of the reflected CRC, then the eight of a byte. */
#define CRC_BIT(c) (((c) >> 1) ^ (POLY & (0u - ((c)&1u))))
#define CRC_BYTE(i)                                                                                \
    CRC_BIT(CRC_BIT(CRC_BIT(CRC_BIT(CRC_BIT(CRC_BIT(CRC_BIT(CRC_BIT((uint32_t)(i)))))))))
#define CRC_ROW4(i) CRC_BYTE(i), CRC_BYTE((i) + 1), CRC_BYTE((i) + 2), CRC_BYTE((i) + 3)
#define CRC_ROW16(i) CRC_ROW4(i), CRC_ROW4((i) + 4), CRC_ROW4((i) + 8), CRC_ROW4((i) + 12)
#define CRC_ROW64(i) CRC_ROW16(i), CRC_ROW16((i) + 16), CRC_ROW16((i) + 32), CRC_ROW16((i) + 48)

static const uint32_t table[256] = {CRC_ROW64(0), CRC_ROW64(64), CRC_ROW64(128), CRC_ROW64(192)};

uint32_t snap_crc32c_portable(uint32_t crc, const void *data, size_t len)
{
    const uint8_t *p = data;
    crc = ~crc;
    while (len--) crc = table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const uint8_t *p, size_t n)
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

static bool have_hw(void)
{
    return __builtin_cpu_supports("sse4.2");
}
#elif defined(__aarch64__)
__attribute__((target("+crc"))) static uint32_t crc_hw(uint32_t crc, const uint8_t *p, size_t n)
{
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t v;
        __builtin_memcpy(&v, p, 8);
        crc = __crc32cd(crc, v);
    }
    for (; n > 0; n--) crc = __crc32cb(crc, *p++);
    return crc;
}

static bool have_hw(void)
{
    return (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0;
}
#endif

uint32_t snap_crc32c(uint32_t crc, const void *data, size_t len)
{
#if defined(__x86_64__) || defined(__aarch64__)
    if (have_hw()) return ~crc_hw(~crc, data, len);
#endif
    return snap_crc32c_portable(crc, data, len);
}
