/* fuzz_engine.c — an engine file (src/plan/engine.c tb_engine_load_mem):
 * the header and section table, then every section's own parser (meta
 * JSON, hardware fingerprint, tokenizer blob, graph) and the weights'
 * placement.
 *
 * The sections are checksummed, so raw mutations rarely get past the table.
 * The first input byte picks one of two forms:
 *   odd:  the rest is an engine image, loaded as it is;
 *   even: the rest is the sections' contents separated by FUZZ_SEP, in the
 *         order meta, hardware, tokenizer, graph, weights (later ones are
 *         named "extra"); the harness lays them out as tb_engine_write does,
 *         with right checksums, so every mutation reaches a section parser.
 */
#define _GNU_SOURCE /* memmem */
#include "fuzz_common.h"
#include "plan/engine.h"

#define FUZZ_SEP "TBFUZSEC"
#define HDR 64
#define ENT 48
#define ALIGN 4096
#define MAX_SEC 8

static uint64_t up(uint64_t x) { return (x + ALIGN - 1) / ALIGN * ALIGN; }

static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

/* The engine image of the sections in `d`, malloc'd; its size in *out_n. */
static uint8_t *assemble(const uint8_t *d, size_t n, size_t *out_n) {
    static const char *names[] = {"meta", "hardware", "tokenizer", "graph", "weights"};
    const uint8_t *ptr[MAX_SEC];
    size_t len[MAX_SEC];
    int k = 0;
    size_t sep = sizeof FUZZ_SEP - 1, pos = 0;
    while (k < MAX_SEC) {
        const uint8_t *q = pos < n ? memmem(d + pos, n - pos, FUZZ_SEP, sep) : NULL;
        size_t end = q ? (size_t)(q - d) : n;
        ptr[k] = d + pos;
        len[k] = end - pos;
        k++;
        if (!q) break;
        pos = end + sep;
    }
    uint64_t off = up(HDR + (uint64_t)k * ENT), offs[MAX_SEC];
    for (int i = 0; i < k; i++) {
        offs[i] = off;
        off = up(off + len[i]);
    }
    uint8_t *img = calloc(1, off);
    if (!img) return NULL;
    uint8_t tab[MAX_SEC * ENT];
    memset(tab, 0, sizeof tab);
    for (int i = 0; i < k; i++) {
        uint8_t *e = tab + i * ENT;
        snprintf((char *)e, 24, "%s", i < 5 ? names[i] : "extra");
        put64(e + 24, offs[i]);
        put64(e + 32, len[i]);
        uint64_t h;
        tb_section_hash(ptr[i], len[i], &h);
        put64(e + 40, h);
        if (len[i]) memcpy(img + offs[i], ptr[i], len[i]);
    }
    memcpy(img, TB_ENGINE_MAGIC, 8);
    uint32_t ver = TB_ENGINE_VERSION, cnt = (uint32_t)k;
    memcpy(img + 8, &ver, 4);
    memcpy(img + 12, &cnt, 4);
    put64(img + 16, off);
    put64(img + 24, tb_hash64(tab, (size_t)k * ENT));
    memcpy(img + HDR, tab, (size_t)k * ENT);
    *out_n = off;
    return img;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    if (size < 1) return 0;
    uint8_t *img;
    size_t n;
    if (data[0] & 1) {
        n = size - 1;
        img = malloc(n ? n : 1); /* a buffer of its own, exactly sized */
        if (!img) return 0;
        if (n) memcpy(img, data + 1, n);
    } else {
        img = assemble(data + 1, size - 1, &n);
        if (!img) return 0;
    }
    tb_engine *e = NULL;
    if (tb_engine_load_mem(img, n, "fuzz.engine", NULL, &e) == TB_OK) {
        tb_engine_info info;
        tb_engine_get_info(e, &info);
        FUZZ_ASSERT(info.vocab_size > 0 && info.n_layers > 0 && info.max_seq_len > 0);
        volatile uint8_t sink = 0;
        for (int i = 0; i < e->graph->n_values; i++) {
            const tb_value *v = &e->graph->values[i];
            if (v->kind != TB_VAL_WEIGHT || !v->nbytes) continue;
            const uint8_t *p = v->data;
            FUZZ_ASSERT(p >= img && p + v->nbytes <= img + n);
            sink ^= p[0] ^ p[v->nbytes - 1];
        }
        (void)sink;
        /* one encoding only: fuzz_tokenizer_blob works the tokenizer section harder */
        int32_t ids[256];
        int k = 0;
        if (tb_tokenizer_encode(tb_engine_tokenizer(e), FUZZ_TEXT, sizeof FUZZ_TEXT - 1, 1, ids, 256, &k) == TB_OK)
            for (int i = 0; i < k; i++) FUZZ_ASSERT(ids[i] >= 0 && ids[i] < tb_tokenizer_vocab_size(tb_engine_tokenizer(e)));
        tb_engine_free(e);
    }
    free(img);
    return 0;
}
