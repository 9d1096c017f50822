/* memory.c — aligned allocation and bump arenas. */
#define _POSIX_C_SOURCE 200809L
#include "core.h"

void *tb_alloc_aligned(size_t n, size_t align) {
    void *p = NULL;
    if (align < sizeof(void *)) align = sizeof(void *);
    if (n == 0) n = align;
    n = (n + align - 1) / align * align;
    if (posix_memalign(&p, align, n) != 0) return NULL;
    return p;
}

void tb_free_aligned(void *p) { free(p); }

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
