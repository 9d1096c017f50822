/* memory.c — aligned allocation, bump arenas, the memory a run may still take. */
#define _POSIX_C_SOURCE 200809L
#include "core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *tb_alloc_aligned(size_t n, size_t align) {
    void *p = NULL;
    if (align < sizeof(void *)) align = sizeof(void *);
    if (n == 0) n = align;
    n = (n + align - 1) / align * align;
    if (posix_memalign(&p, align, n) != 0) return NULL;
    return p;
}

void tb_free_aligned(void *p) { free(p); }

/* The first unsigned number of file path (0 when unreadable or "max"). */
static uint64_t file_u64(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    unsigned long long v = 0;
    if (fscanf(f, "%llu", &v) != 1) v = 0;
    fclose(f);
    return (uint64_t)v;
}

uint64_t tb_mem_available(void) {
    const char *env = getenv("TURBINE_MEM_AVAILABLE");
    if (env && *env) return (uint64_t)strtoull(env, NULL, 10);
    uint64_t avail = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        unsigned long long kb;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
                avail = (uint64_t)kb * 1024;
                break;
            }
        fclose(f);
    }
    /* the cgroup's limit less its use (v2, then v1; an unlimited v1 group
     * reports a huge limit, which changes nothing); the use counts the
     * group's file cache, which the kernel reclaims before it fails an
     * allocation: that part is counted as free */
    uint64_t lim = file_u64("/sys/fs/cgroup/memory.max"), used = file_u64("/sys/fs/cgroup/memory.current");
    const char *stat = "/sys/fs/cgroup/memory.stat", *key = "file";
    if (!lim) {
        lim = file_u64("/sys/fs/cgroup/memory/memory.limit_in_bytes");
        used = file_u64("/sys/fs/cgroup/memory/memory.usage_in_bytes");
        stat = "/sys/fs/cgroup/memory/memory.stat";
        key = "cache";
    }
    if (lim) {
        uint64_t cache = 0;
        FILE *sf = fopen(stat, "r");
        if (sf) {
            char name[64];
            unsigned long long v;
            while (fscanf(sf, "%63s %llu", name, &v) == 2)
                if (!strcmp(name, key)) {
                    cache = (uint64_t)v;
                    break;
                }
            fclose(sf);
        }
        uint64_t busy = used > cache ? used - cache : 0;
        uint64_t left = lim > busy ? lim - busy : 0;
        if (!avail || left < avail) avail = left;
    }
    return avail;
}

tb_status tb_arena_init(tb_arena *a, size_t cap) {
    a->base = tb_alloc_aligned(cap, 64);
    a->cap = a->base ? cap : 0;
    a->used = 0;
    if (!a->base) return tb_errorf(TB_ERR_OOM, "cannot allocate an arena of %zu bytes", cap);
    return TB_OK;
}

void *tb_arena_alloc(tb_arena *a, size_t n, size_t align) {
    size_t off = (a->used + align - 1) / align * align;
    if (off + n > a->cap) return NULL;
    a->used = off + n;
    return a->base + off;
}

void tb_arena_reset(tb_arena *a) { a->used = 0; }

void tb_arena_free(tb_arena *a) {
    if (!a) return;
    tb_free_aligned(a->base);
    a->base = NULL;
    a->cap = a->used = 0;
}
