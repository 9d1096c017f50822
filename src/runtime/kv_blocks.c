/* kv_blocks.c — block allocator and prefix cache of the paged KV cache (see kv_blocks.h). */
#include "runtime/kv_blocks.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

struct tb_kv_pool {
    int n_blocks, block_size, cache;
    int32_t *ref;          /* (n_blocks) sequences holding the block */
    int32_t *free_stack;   /* (n_blocks) never published, nobody holds them */
    int n_free;
    /* published blocks */
    uint8_t *published;    /* (n_blocks) */
    uint64_t *key;         /* (n_blocks) */
    int32_t *tokens;       /* (n_blocks, block_size) the tokens a block holds */
    int32_t *slots;        /* (cap) open addressing, linear probing; -1 empty */
    uint32_t mask;
    /* idle published blocks, least recently released first */
    int32_t *prev, *next;  /* (n_blocks) */
    int32_t head, tail;
    int n_idle;
};

static uint32_t home(const tb_kv_pool *p, uint64_t k) { return (uint32_t)(k ^ (k >> 32)) & p->mask; }

tb_status tb_kv_pool_create(int n_blocks, int block_size, int cache, tb_kv_pool **out) {
    *out = NULL;
    if (n_blocks < 1 || n_blocks > (1 << 29) || block_size < 1)
        return tb_errorf(TB_ERR_INVALID_ARG, "KV block pool: %d blocks of %d tokens", n_blocks, block_size);
    tb_kv_pool *p = calloc(1, sizeof *p);
    if (!p) return tb_errorf(TB_ERR_OOM, "out of memory");
    p->n_blocks = n_blocks;
    p->block_size = block_size;
    p->cache = cache != 0;
    p->ref = calloc((size_t)n_blocks, sizeof(int32_t));
    p->free_stack = calloc((size_t)n_blocks, sizeof(int32_t));
    int ok = p->ref && p->free_stack;
    if (p->cache) {
        uint32_t cap = 16;
        while (cap < 2u * (uint32_t)n_blocks) cap <<= 1;
        p->mask = cap - 1;
        p->published = calloc((size_t)n_blocks, 1);
        p->key = calloc((size_t)n_blocks, sizeof(uint64_t));
        p->tokens = calloc((size_t)n_blocks * (size_t)block_size, sizeof(int32_t));
        p->slots = malloc(sizeof(int32_t) * cap);
        p->prev = calloc((size_t)n_blocks, sizeof(int32_t));
        p->next = calloc((size_t)n_blocks, sizeof(int32_t));
        ok = ok && p->published && p->key && p->tokens && p->slots && p->prev && p->next;
        if (p->slots) memset(p->slots, 0xff, sizeof(int32_t) * cap);
    }
    if (!ok) {
        tb_kv_pool_free(p);
        return tb_errorf(TB_ERR_OOM, "cannot allocate the KV block table of %d blocks", n_blocks);
    }
    /* block 0 on top: a fresh pool hands out 0, 1, 2, ... */
    for (int i = 0; i < n_blocks; i++) p->free_stack[i] = n_blocks - 1 - i;
    p->n_free = n_blocks;
    p->head = p->tail = -1;
    *out = p;
    return TB_OK;
}

void tb_kv_pool_free(tb_kv_pool *p) {
    if (!p) return;
    free(p->ref); free(p->free_stack); free(p->published); free(p->key); free(p->tokens);
    free(p->slots); free(p->prev); free(p->next);
    free(p);
}

int tb_kv_pool_available(const tb_kv_pool *p) { return p->n_free + p->n_idle; }
int tb_kv_pool_idle_cached(const tb_kv_pool *p) { return p->n_idle; }
int tb_kv_pool_caching(const tb_kv_pool *p) { return p->cache; }

/* ---------------------------------------------------------------- idle list */

static void idle_push(tb_kv_pool *p, int32_t b) {
    p->prev[b] = p->tail;
    p->next[b] = -1;
    if (p->tail >= 0) p->next[p->tail] = b;
    else p->head = b;
    p->tail = b;
    p->n_idle++;
}

static void idle_remove(tb_kv_pool *p, int32_t b) {
    if (p->prev[b] >= 0) p->next[p->prev[b]] = p->next[b];
    else p->head = p->next[b];
    if (p->next[b] >= 0) p->prev[p->next[b]] = p->prev[b];
    else p->tail = p->prev[b];
    p->n_idle--;
}

/* ---------------------------------------------------------------- key table */

static int32_t table_find(const tb_kv_pool *p, uint64_t k, const int32_t *tokens) {
    for (uint32_t i = home(p, k);; i = (i + 1) & p->mask) {
        int32_t b = p->slots[i];
        if (b < 0) return -1;
        if (p->key[b] == k &&
            !memcmp(p->tokens + (size_t)b * (size_t)p->block_size, tokens, sizeof(int32_t) * (size_t)p->block_size))
            return b;
    }
}

static void table_insert(tb_kv_pool *p, int32_t b) {
    uint32_t i = home(p, p->key[b]);
    while (p->slots[i] >= 0) i = (i + 1) & p->mask;
    p->slots[i] = b;
}

/* Removes b by shifting later entries of its probe run back into the hole. */
static void table_remove(tb_kv_pool *p, int32_t b) {
    uint32_t i = home(p, p->key[b]);
    while (p->slots[i] != b) i = (i + 1) & p->mask;
    for (uint32_t j = (i + 1) & p->mask; p->slots[j] >= 0; j = (j + 1) & p->mask) {
        uint32_t h = home(p, p->key[p->slots[j]]);
        /* the entry at j may move to the hole at i when its home is not in (i, j] (cyclically) */
        int stays = i <= j ? (h > i && h <= j) : (h > i || h <= j);
        if (!stays) {
            p->slots[i] = p->slots[j];
            i = j;
        }
    }
    p->slots[i] = -1;
}

/* ---------------------------------------------------------------- blocks */

int32_t tb_kv_pool_take(tb_kv_pool *p) {
    int32_t b;
    if (p->n_free > 0) {
        b = p->free_stack[--p->n_free];
    } else if (p->n_idle > 0) { /* evict the least recently released cached block */
        b = p->head;
        idle_remove(p, b);
        table_remove(p, b);
        p->published[b] = 0;
    } else {
        return -1;
    }
    p->ref[b] = 1;
    return b;
}

void tb_kv_pool_release(tb_kv_pool *p, int32_t b) {
    if (--p->ref[b] > 0) return;
    if (p->cache && p->published[b]) idle_push(p, b);
    else p->free_stack[p->n_free++] = b;
}

uint64_t tb_kv_pool_key(const tb_kv_pool *p, uint64_t parent, const int32_t *tokens) {
    uint64_t k = XXH3_64bits_withSeed(tokens, sizeof(int32_t) * (size_t)p->block_size, parent);
    return k ? k : 1; /* 0 stands for "no prefix" */
}

uint64_t tb_kv_pool_publish(tb_kv_pool *p, int32_t b, uint64_t parent, const int32_t *tokens) {
    uint64_t k = tb_kv_pool_key(p, parent, tokens);
    if (!p->cache || p->published[b] || table_find(p, k, tokens) >= 0) return k;
    p->key[b] = k;
    memcpy(p->tokens + (size_t)b * (size_t)p->block_size, tokens, sizeof(int32_t) * (size_t)p->block_size);
    p->published[b] = 1;
    table_insert(p, b);
    return k;
}

int tb_kv_pool_match(tb_kv_pool *p, const int32_t *tokens, int max_blocks, int32_t *blocks, uint64_t *key) {
    *key = 0;
    if (!p->cache) return 0;
    uint64_t k = 0;
    int n = 0;
    for (; n < max_blocks; n++) {
        const int32_t *t = tokens + (size_t)n * (size_t)p->block_size;
        uint64_t kn = tb_kv_pool_key(p, k, t);
        int32_t b = table_find(p, kn, t);
        if (b < 0) break;
        if (p->ref[b]++ == 0) idle_remove(p, b);
        blocks[n] = b;
        k = kn;
    }
    *key = k;
    return n;
}
