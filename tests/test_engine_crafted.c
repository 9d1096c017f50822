/*
 * test_engine_crafted.c — engines written to pass their checksums but not
 * consistent inside are refused at load with a message, never run:
 *   - a meta section allowing steps longer than the graph's profile (the
 *     activation arena is planned for the profile's maximum);
 *   - a graph whose nodes are out of topological order (a node reads a value
 *     no earlier node wrote), or writes a weight, or writes a value twice;
 *   - a profile with max 0 or min > max;
 * and a section hash whose chunk table cannot be allocated is TB_ERR_OOM.
 * Each crafted file is rewritten with tb_engine_write, so every checksum is
 * right: only the new checks can catch them.
 */
#include <stdint.h>

#include "plan/engine.h"
#include "runtime/runtime.h"
#include "tb_test.h"

#define MAX_SEC 16

typedef struct {
    char name[24];
    uint8_t *data;
    uint64_t size;
} section;

static int n_sec;
static section secs[MAX_SEC];

static int read_sections(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)size);
    if (!buf || fread(buf, 1, (size_t)size, f) != (size_t)size) { fclose(f); free(buf); return 0; }
    fclose(f);
    uint32_t cnt;
    memcpy(&cnt, buf + 12, 4);
    n_sec = (int)cnt;
    for (int i = 0; i < n_sec && i < MAX_SEC; i++) {
        const uint8_t *e = buf + 64 + (size_t)i * 48;
        uint64_t off, sz;
        memcpy(secs[i].name, e, 24);
        memcpy(&off, e + 24, 8);
        memcpy(&sz, e + 32, 8);
        secs[i].data = malloc(sz + 1);
        memcpy(secs[i].data, buf + off, sz);
        secs[i].size = sz;
    }
    free(buf);
    return 1;
}

static section *find(const char *name) {
    for (int i = 0; i < n_sec; i++)
        if (!strcmp(secs[i].name, name)) return &secs[i];
    return NULL;
}

/* Writes the sections, with `name` replaced by data/size when given. */
static int write_with(const char *path, const char *name, const void *data, uint64_t size) {
    tb_section_src src[MAX_SEC];
    for (int i = 0; i < n_sec; i++) {
        int repl = name && !strcmp(secs[i].name, name);
        src[i] = (tb_section_src){secs[i].name, repl ? data : secs[i].data, repl ? size : secs[i].size};
    }
    return tb_engine_write(path, src, n_sec) == TB_OK;
}

/* Writes the sections without the one named `drop`. */
static int write_without(const char *path, const char *drop) {
    tb_section_src src[MAX_SEC];
    int n = 0;
    for (int i = 0; i < n_sec; i++)
        if (strcmp(secs[i].name, drop)) src[n++] = (tb_section_src){secs[i].name, secs[i].data, secs[i].size};
    return tb_engine_write(path, src, n) == TB_OK;
}

/* Loads and creates a context; returns 1 when both succeed. */
static int loads(const char *path, char *msg, size_t cap) {
    tb_engine *e = NULL;
    tb_context *c = NULL;
    msg[0] = 0;
    if (tb_engine_load(path, &e) != TB_OK) { snprintf(msg, cap, "%s", tb_last_error()); return 0; }
    tb_status s = tb_context_create(e, NULL, &c);
    if (s != TB_OK) snprintf(msg, cap, "%s", tb_last_error());
    tb_context_free(c);
    tb_engine_free(e);
    return s == TB_OK;
}

/* A graph section changed by `edit`, written to `path`. */
static int write_graph_edit_of(const char *path, const char *sec, void (*edit)(tb_graph *)) {
    section *gs = find(sec);
    tb_graph *g = NULL;
    if (!gs || tb_graph_deserialize(gs->data, gs->size, &g) != TB_OK) return 0;
    edit(g);
    uint8_t *buf = NULL;
    size_t n = 0;
    int ok = tb_graph_serialize(g, &buf, &n) == TB_OK && write_with(path, sec, buf, n);
    free(buf);
    tb_graph_free(g);
    return ok;
}

static int write_graph_edit(const char *path, void (*edit)(tb_graph *)) { return write_graph_edit_of(path, "graph", edit); }

/* The first node whose output the next node reads: swapping them puts a read
 * before its write. */
static void swap_producer(tb_graph *g) {
    for (int k = 0; k + 1 < g->n_nodes; k++) {
        const tb_node *nx = &g->nodes[k + 1];
        for (int j = 0; j < nx->n_in; j++)
            if (nx->in[j] == g->nodes[k].out[0]) {
                tb_node t = g->nodes[k];
                g->nodes[k] = g->nodes[k + 1];
                g->nodes[k + 1] = t;
                return;
            }
    }
}

static void write_twice(tb_graph *g) {
    /* the last node writes the first node's output again (same shape rule
     * would not apply, but the order check comes first) */
    g->nodes[g->n_nodes - 1].out[0] = g->nodes[0].out[0];
}

static void write_weight(tb_graph *g) {
    for (int v = 0; v < g->n_values; v++)
        if (g->values[v].kind == TB_VAL_WEIGHT) { g->nodes[0].out[0] = v; return; }
}

static void zero_profile(tb_graph *g) { g->syms[0].max = 0; }
/* a rank's attention over all KV heads instead of its share */
static void whole_kv_heads(tb_graph *g) {
    for (int k = 0; k < g->n_nodes; k++)
        if (g->nodes[k].op == TB_OP_ATTENTION) g->nodes[k].i[2] *= 2;
}
static void inverted_profile(tb_graph *g) { g->syms[0].min = g->syms[0].max + 1; }

int main(void) {
    char model[1024], tok[1024], good[1024], bad[1024], msg[1024];
    snprintf(model, sizeof model, "%s/models/stories260K/stories260K.bin", tb_test_shared());
    snprintf(tok, sizeof tok, "%s/models/stories260K/tok512.bin", tb_test_shared());
    snprintf(good, sizeof good, "%s/crafted_good.engine", tb_test_tmp());
    snprintf(bad, sizeof bad, "%s/crafted_bad.engine", tb_test_tmp());
    tb_build_options o;
    tb_build_options_default(&o);
    o.tokenizer_path = tok;
    if (tb_build(model, good, &o, NULL) != TB_OK) {
        fprintf(stderr, "build: %s\n", tb_last_error());
        return 1;
    }
    CHECK(read_sections(good));
    CHECK(find("meta") && find("graph"));

    /* the untouched sections written again load (the harness itself works) */
    CHECK(write_with(bad, NULL, NULL, 0));
    CHECK_MSG(loads(bad, msg, sizeof msg), "rewritten good engine: %s", msg);

    /* meta: a step bound 64x the planned one */
    section *meta = find("meta");
    char *m = (char *)meta->data;
    m[meta->size] = 0;
    char *at = strstr(m, "\"max_step_tokens\"");
    CHECK(at != NULL);
    if (at) {
        char *colon = strchr(at, ':');
        long old = strtol(colon + 1, NULL, 10);
        char edited[65536];
        int head = (int)(colon + 1 - m);
        char *rest = colon + 1;
        while (*rest == ' ' || (*rest >= '0' && *rest <= '9')) rest++;
        int n = snprintf(edited, sizeof edited, "%.*s %ld%s", head, m, old * 64, rest);
        CHECK(write_with(bad, "meta", edited, (uint64_t)n));
        CHECK_MSG(!loads(bad, msg, sizeof msg), "oversized step bound was accepted");
        CHECK_MSG(strstr(msg, "profile") != NULL, "message: %s", msg);
        printf("step bound %ld -> %ld: %s\n", old, old * 64, msg);
    }

    struct { const char *what; void (*edit)(tb_graph *); const char *want; } cases[] = {
        {"nodes out of order", swap_producer, "before any node writes it"},
        {"a value written twice", write_twice, "not a fresh activation"},
        {"a node writing a weight", write_weight, "not a fresh activation"},
        {"profile max 0", zero_profile, "invalid profile"},
        {"profile min > max", inverted_profile, "invalid profile"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK(write_graph_edit(bad, cases[i].edit));
        int ok = loads(bad, msg, sizeof msg);
        CHECK_MSG(!ok, "%s: accepted", cases[i].what);
        CHECK_MSG(strstr(msg, cases[i].want) != NULL, "%s: message '%s' lacks '%s'", cases[i].what, msg,
                  cases[i].want);
        printf("%s: %s\n", cases[i].what, msg);
    }
    /* a chunk table that cannot be allocated is an out-of-memory error, not a
     * checksum (a corrupt-file report); 2^62 bytes need a 512 GiB table, which
     * is refused before any byte is read */
#ifndef __SANITIZE_ADDRESS__ /* AddressSanitizer's allocator aborts on such a request by default */
    FILE *oc = fopen("/proc/sys/vm/overcommit_memory", "r");
    int mode = oc && fgetc(oc) == '1';
    if (oc) fclose(oc);
    if (!mode) { /* with "always overcommit" the table would be granted and the hash read past the buffer */
        uint64_t h = 1;
        tb_status hs = tb_section_hash(secs[0].data, (uint64_t)1 << 62, &h);
        CHECK_MSG(hs == TB_ERR_OOM, "hashing an unallocatable table: status %d (%s)", (int)hs, tb_last_error());
    }
#endif
    /* a weight the graph cannot take is freed by it (ownership passes even on
     * failure: LeakSanitizer reports it otherwise) and the cause is kept */
    tb_graph *g = tb_graph_new();
    int64_t dims[TB_MAX_RANK + 1] = {0};
    tb_error_clear();
    CHECK(tb_graph_add_weight(g, "w", TB_F32, TB_MAX_RANK + 1, dims, malloc(64), 1) < 0);
    CHECK_MSG(tb_last_status() == TB_ERR_INVALID_ARG, "status %d: %s", (int)tb_last_status(), tb_last_error());
    tb_graph_free(g);
    for (int i = 0; i < n_sec; i++) free(secs[i].data);

    /* a tensor-parallel engine: a rank's sections and its share are checked */
    o.tp = 2;
    CHECK(tb_build(model, good, &o, NULL) == TB_OK);
    CHECK(read_sections(good));
    CHECK(find("graph.1") && find("weights.1"));
    CHECK(write_with(bad, NULL, NULL, 0));
    CHECK_MSG(loads(bad, msg, sizeof msg), "rewritten tp 2 engine: %s", msg);
    CHECK(write_without(bad, "weights.1"));
    CHECK_MSG(!loads(bad, msg, sizeof msg) && strstr(msg, "'weights.1' of tensor-parallel rank 1"),
              "tp 2 engine without weights.1: %s", msg);
    printf("tp 2 without weights.1: %s\n", msg);
    CHECK(write_graph_edit_of(bad, "graph.1", whole_kv_heads));
    CHECK_MSG(!loads(bad, msg, sizeof msg) && strstr(msg, "attention"),
              "rank 1 attending over every KV head: %s", msg);
    printf("rank 1 over every KV head: %s\n", msg);
    meta = find("meta");
    m = (char *)meta->data;
    m[meta->size] = 0;
    at = strstr(m, "\"tensor_parallel\":2");
    CHECK(at != NULL);
    if (at) {
        at[strlen("\"tensor_parallel\":")] = '3';
        CHECK(write_with(bad, NULL, NULL, 0));
        CHECK_MSG(!loads(bad, msg, sizeof msg) && strstr(msg, "tensor_parallel 3"), "tensor_parallel 3: %s", msg);
        printf("meta tensor_parallel 3: %s\n", msg);
    }
    for (int i = 0; i < n_sec; i++) free(secs[i].data);
    return tb_test_finish("test_engine_crafted");
}
