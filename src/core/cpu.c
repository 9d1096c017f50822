/* cpu.c — CPU feature probe (CPUID + XGETBV), clock and checksum. */
#define _GNU_SOURCE
#include "core.h"

#include <cpuid.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

uint32_t tb_cpu_features(void) {
    static uint32_t cached = 0xffffffffu;
    if (cached != 0xffffffffu) return cached;
    uint32_t f = 0, a, b, c, d;
    if (__get_cpuid(1, &a, &b, &c, &d)) {
        int osxsave = (c >> 27) & 1;
        uint64_t xcr0 = osxsave ? xgetbv0() : 0;
        int ymm_ok = (xcr0 & 6) == 6, zmm_ok = (xcr0 & 0xe6) == 0xe6;
        if (ymm_ok && (c >> 12) & 1) f |= TB_CPU_FMA;
        if (ymm_ok && (c >> 29) & 1) f |= TB_CPU_F16C;
        if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
            if (ymm_ok && (b >> 5) & 1) f |= TB_CPU_AVX2;
            if (zmm_ok && (b >> 16) & 1) f |= TB_CPU_AVX512F;
            if (zmm_ok && (b >> 30) & 1) f |= TB_CPU_AVX512BW;
            if (zmm_ok && (b >> 31) & 1) f |= TB_CPU_AVX512VL;
            if (zmm_ok && (d >> 23) & 1) f |= TB_CPU_AVX512FP16;
        }
        if (__get_cpuid_count(7, 1, &a, &b, &c, &d))
            if (zmm_ok && (a >> 5) & 1) f |= TB_CPU_AVX512BF16;
    }
    const char *mask = getenv("TB_CPU_MASK");
    if (mask && *mask) f &= (uint32_t)strtoul(mask, NULL, 16);
    cached = f;
    return f;
}

void tb_cpu_features_str(uint32_t f, char *buf, size_t cap) {
    static const char *names[] = {"avx2", "fma", "f16c", "avx512f", "avx512bw",
                                  "avx512vl", "avx512bf16", "avx512fp16"};
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0; i < 8; i++)
        if (f & (1u << i)) n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "%s%s", n ? " " : "", names[i]);
    if (n == 0) snprintf(buf, cap, "scalar");
}

void tb_cpu_model_name(char *buf, size_t cap) {
    uint32_t regs[12];
    if (__get_cpuid(0x80000000, &regs[0], &regs[1], &regs[2], &regs[3]) && regs[0] >= 0x80000004) {
        for (uint32_t i = 0; i < 3; i++)
            __get_cpuid(0x80000002 + i, &regs[4 * i], &regs[4 * i + 1], &regs[4 * i + 2], &regs[4 * i + 3]);
        char name[49];
        memcpy(name, regs, 48);
        name[48] = 0;
        char *s = name;
        while (*s == ' ') s++;
        snprintf(buf, cap, "%s", s);
    } else {
        snprintf(buf, cap, "unknown x86-64");
    }
}

double tb_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int tb_default_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

uint64_t tb_hash64(const void *data, size_t n) { return XXH3_64bits(data, n); }
