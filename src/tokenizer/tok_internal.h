/*
 * tok_internal.h — the tb_tokenizer struct shared by the tokenizer files.
 *
 * A tokenizer is a description (vocab strings and scores, merges, the
 * normalizer and pre-tokenizer steps, added tokens, special ids) plus what is
 * derived from it at load (hash maps, decoded pieces, compiled regexes).
 * The loaders (tok_llama2c.c, tok_json.c, tok_serialize.c) fill the
 * description and call tok_finalize(), which builds the rest; tok_bpe.c
 * encodes, tok_common.c decodes and answers the accessors.
 */
#ifndef TB_TOK_INTERNAL_H
#define TB_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer/tokenizer.h"

#define TOK_MAX_STEPS 16
#define TOK_MAX_EOS 8
#define TOK_MAX_VOCAB (1 << 22)
#define TOK_MAX_PIECE (1 << 16) /* longest vocab string accepted */

/* Per-token flags. */
enum {
    TOK_F_SPECIAL = 1u << 0, /* decodes to "" (control / special added token) */
    TOK_F_ADDED = 1u << 1,   /* an added token, matched verbatim in text      */
    TOK_F_LSTRIP = 1u << 2,  /* added token swallows whitespace on its left   */
    TOK_F_RSTRIP = 1u << 3,  /* ... and on its right                          */
    TOK_F_LEADSP = 1u << 4,  /* derived: decoded piece starts with a space    */
};

/* Model flags. */
enum {
    TOK_M_BYTE_FALLBACK = 1u << 0, /* unknown chars -> <0xXX> tokens         */
    TOK_M_IGNORE_MERGES = 1u << 1, /* a whole word in the vocab is kept      */
    TOK_M_BYTE_LEVEL = 1u << 2,    /* bytes mapped to unicode before merges  */
    TOK_M_FUSE_UNK = 1u << 3,      /* consecutive unknowns become one unk    */
    TOK_M_STRIP_LEAD = 1u << 4,    /* decoder drops the first leading space  */
};

typedef enum {
    TOK_NORM_PREPEND = 1, /* a: text put in front of a non-empty segment */
    TOK_NORM_REPLACE = 2, /* a -> b, literal                              */
    TOK_NORM_NFC = 3,     /* accepted as identity (input assumed NFC)     */
} tok_norm_type;

typedef enum {
    TOK_PRE_SPLIT = 1,     /* str: regex; behavior: TOK_SPLIT_*               */
    TOK_PRE_BYTELEVEL = 2, /* flag1: add_prefix_space; flag2: use_regex       */
    TOK_PRE_METASPACE = 3, /* str: replacement; flag1: scheme; flag2: split   */
} tok_pre_type;

enum { TOK_SPLIT_ISOLATED = 0, TOK_SPLIT_REMOVED = 1, TOK_SPLIT_MERGED_PREV = 2,
       TOK_SPLIT_MERGED_NEXT = 3 };
enum { TOK_PREPEND_ALWAYS = 0, TOK_PREPEND_FIRST = 1, TOK_PREPEND_NEVER = 2 };

typedef struct {
    uint8_t type;
    char *a, *b; /* owned, NUL-terminated */
} tok_norm;

typedef struct {
    uint8_t type, behavior, flag1, flag2;
    char *str;       /* owned, NUL-terminated; regex source or replacement */
    pcre2_code *re;  /* derived: compiled `str` (SPLIT, BYTELEVEL+use_regex) */
} tok_pre;

struct tb_tokenizer {
    /* ---- description (what tb_tokenizer_serialize writes) */
    tb_tokenizer_kind kind;
    uint32_t mflags;          /* TOK_M_* */
    int n_vocab;
    char *pool;               /* vocab strings, each NUL-terminated       */
    size_t pool_len;
    uint32_t *off, *len;      /* (n_vocab) position and length in pool    */
    float *score;             /* (n_vocab) llama2.c scores, else NULL     */
    uint8_t *tflags;          /* (n_vocab) TOK_F_*                        */
    int n_merges;
    int32_t *merges;          /* (n_merges, 3) left id, right id, result  */
    int n_norm, n_pre;
    tok_norm norm[TOK_MAX_STEPS];
    tok_pre pre[TOK_MAX_STEPS];
    int unk;                  /* -1: none */
    int bos;                  /* -1: none */
    int n_eos;
    int32_t eos[TOK_MAX_EOS];
    int add_bos;
    char *chat_template;      /* owned or NULL */

    /* ---- derived at load (tok_finalize) */
    int32_t *vmap;            /* string -> id, open addressing, -1 empty  */
    uint32_t vmap_mask;
    uint64_t *pkeys;          /* (left << 32 | right) -> rank             */
    int32_t *pvals;
    uint32_t pmask;
    char *dpool;              /* decoded piece bytes of every token       */
    uint32_t *doff, *dlen;
    int32_t byte_tok[256];    /* byte-fallback id (<0xXX>) or -1          */
    int32_t byte_sym[256];    /* byte-level: id of the mapped char, or -1 */
    int n_added;
    int32_t *added;           /* added token ids, longest string first    */
    uint8_t added_first[256 / 8]; /* first bytes of added tokens          */
    uint32_t max_len;         /* longest vocab string                     */
};

/* tok_common.c */
tb_status tok_alloc(int n_vocab, size_t pool_cap, tb_tokenizer **out);
/* Appends vocab string `id` (pool must have room). */
void tok_set_piece(tb_tokenizer *t, int id, const char *s, uint32_t n,
                   size_t *pool_used);
/* The vocab map alone (loaders resolve merges with it), then the rest. */
tb_status tok_build_vmap(tb_tokenizer *t);
tb_status tok_finalize(tb_tokenizer *t);
int tok_lookup(const tb_tokenizer *t, const char *s, size_t n);
int tok_pair_rank(const tb_tokenizer *t, int a, int b);
/* Byte-level table: the unicode code point byte b is written as. */
uint32_t tok_byte_to_cp(int b);
char *tok_strdup(const char *s);

#endif
