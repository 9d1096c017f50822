/*
 * kv_blocks.h — the KV cache's block allocator and its prefix cache.
 *
 * The pool hands out block ids of the paged KV cache; it never touches the
 * cache's memory. Each block has a reference count (the sequences whose
 * block tables hold it). With the prefix cache on, a full block can be
 * published under a key made of the tokens that filled it and the key of
 * the block before it (a hash chain from the sequence's first token, so a
 * key names the whole prefix). A later sequence whose tokens begin the same
 * way takes the published blocks instead of computing them again. Blocks
 * nobody holds but still published stay readable in an LRU list and count
 * as available: they are reused, least recently released first, only when
 * no never-published block is left.
 *
 * A match compares the block's stored tokens too, so a hash collision of
 * the last block can not attach wrong KV; the chain hash stands for the
 * tokens before it (64 bits).
 *
 * Sized at creation; nothing here allocates afterwards.
 */
#ifndef TB_KV_BLOCKS_H
#define TB_KV_BLOCKS_H

#include <stdint.h>

#include "core/core.h"

typedef struct tb_kv_pool tb_kv_pool;

/* `cache`: 0 turns publishing (and so matching) off. */
tb_status tb_kv_pool_create(int n_blocks, int block_size, int cache, tb_kv_pool **out);
void tb_kv_pool_free(tb_kv_pool *p);

/* Blocks a sequence can still get: never used or released, plus cached
 * ones nobody holds. */
int tb_kv_pool_available(const tb_kv_pool *p);
/* Cached blocks nobody holds (part of tb_kv_pool_available). */
int tb_kv_pool_idle_cached(const tb_kv_pool *p);
int tb_kv_pool_caching(const tb_kv_pool *p);

/* A block with reference count 1, or -1 when none is available. */
int32_t tb_kv_pool_take(tb_kv_pool *p);
/* Drops one reference; at zero the block becomes free, or idle-cached
 * when it is published. */
void tb_kv_pool_release(tb_kv_pool *p, int32_t b);

/* The key of a full block of `block_size` tokens after the prefix keyed
 * `parent` (0 for the first block). */
uint64_t tb_kv_pool_key(const tb_kv_pool *p, uint64_t parent, const int32_t *tokens);
/* Publishes held block b, which holds the KV of `tokens` (block_size of
 * them) at the positions after the prefix keyed `parent`; returns its key.
 * A prefix already published under that key keeps its block. */
uint64_t tb_kv_pool_publish(tb_kv_pool *p, int32_t b, uint64_t parent, const int32_t *tokens);
/* Follows the chain for up to max_blocks full blocks of `tokens`: each block
 * found is referenced once more and written to blocks[]; returns how many,
 * with the last one's key in *key (0 when none). */
int tb_kv_pool_match(tb_kv_pool *p, const int32_t *tokens, int max_blocks, int32_t *blocks, uint64_t *key);

#endif
