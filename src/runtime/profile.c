/*
 * profile.c — per-op-kind timing for `turbine bench --engine --profile`.
 *
 * The totals live beside the contexts, in a small table keyed by context,
 * so that tb_context stays unchanged and a context that is never profiled
 * pays one branch per node. Op kinds are matched by name pointer first (the
 * names are static strings), then by content.
 */
#include "runtime/runtime.h"

#define TB_PROF_CONTEXTS 8
#define TB_PROF_KINDS 96

typedef struct {
    const tb_context *ctx;
    int n;
    const char *name[TB_PROF_KINDS];
    double seconds[TB_PROF_KINDS];
} prof_entry;

static prof_entry g_prof[TB_PROF_CONTEXTS];

static prof_entry *find(const tb_context *c) {
    for (int i = 0; i < TB_PROF_CONTEXTS; i++)
        if (c && g_prof[i].ctx == c) return &g_prof[i];
    return NULL;
}

tb_status tb_context_set_profiling(tb_context *c, int on) {
    if (!c) return tb_errorf(TB_ERR_INVALID_ARG, "profiling: no context");
    prof_entry *e = find(c);
    if (!on) {
        if (e) memset(e, 0, sizeof *e);
        return TB_OK;
    }
    for (int i = 0; !e && i < TB_PROF_CONTEXTS; i++)
        if (!g_prof[i].ctx) e = &g_prof[i];
    if (!e) return tb_errorf(TB_ERR_OOM, "profiling: at most %d contexts at once", TB_PROF_CONTEXTS);
    memset(e, 0, sizeof *e);
    e->ctx = c;
    return TB_OK;
}

int tb_profile_enabled(const tb_context *c) { return find(c) != NULL; }

void tb_profile_add(const tb_context *c, const char *kind, double seconds) {
    prof_entry *e = find(c);
    if (!e || !kind) return;
    for (int i = 0; i < e->n; i++)
        if (e->name[i] == kind || !strcmp(e->name[i], kind)) { e->seconds[i] += seconds; return; }
    if (e->n < TB_PROF_KINDS) {
        e->name[e->n] = kind;
        e->seconds[e->n++] = seconds;
    }
}

int tb_context_profile(const tb_context *c, const char **names, double *seconds, int cap) {
    const prof_entry *e = find(c);
    if (!e) return 0;
    for (int i = 0; i < e->n && i < cap; i++) {
        names[i] = e->name[i];
        seconds[i] = e->seconds[i];
    }
    return e->n;
}
