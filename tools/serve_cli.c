/* serve_cli.c — `turbine serve`: options, then the server. With no engine
 * argument it builds (once) and serves the bundled demo model. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "cli.h"
#include "serve/server.h"
#include "turbine/turbine.h"

#ifndef TB_DEMO_MODEL_DIR
#define TB_DEMO_MODEL_DIR "models/demo/shakespeare"
#endif

/* "512MiB", "2G", "1000000" -> bytes; 0 on error. */
static size_t parse_size(const char *s) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v <= 0) return 0;
    double mul = 1;
    if (!strcasecmp(end, "k") || !strcasecmp(end, "kb") || !strcasecmp(end, "kib")) mul = 1024.0;
    else if (!strcasecmp(end, "m") || !strcasecmp(end, "mb") || !strcasecmp(end, "mib")) mul = 1024.0 * 1024;
    else if (!strcasecmp(end, "g") || !strcasecmp(end, "gb") || !strcasecmp(end, "gib")) mul = 1024.0 * 1024 * 1024;
    else if (*end) return 0;
    return (size_t)(v * mul);
}


/* Builds the demo engine next to the CLI's cache folder when missing. */
static const char *demo_engine(char *path, size_t cap) {
    const char *home = getenv("XDG_CACHE_HOME");
    char dir[PATH_MAX];
    if (home && *home) snprintf(dir, sizeof dir, "%s/turbine", home);
    else snprintf(dir, sizeof dir, "%s/.cache/turbine", getenv("HOME") ? getenv("HOME") : "/tmp");
    char parent[PATH_MAX];
    snprintf(parent, sizeof parent, "%s", dir);
    char *slash = strrchr(parent, '/');
    if (slash) { *slash = 0; mkdir(parent, 0755); }
    mkdir(dir, 0755);
    snprintf(path, cap, "%s/shakespeare-demo.engine", dir);
    struct stat st;
    if (stat(path, &st) == 0) {
        tb_engine *e = NULL;
        if (tb_engine_load(path, &e) == TB_OK) { tb_engine_free(e); return path; }
    }
    fprintf(stderr, "turbine: building the demo model from %s\n", TB_DEMO_MODEL_DIR);
    tb_build_options o;
    tb_build_options_default(&o);
    o.max_batch = 16;
    if (tb_build(TB_DEMO_MODEL_DIR, path, &o, NULL) != TB_OK) {
        fprintf(stderr, "turbine: error: cannot build the demo model: %s\n", tb_last_error());
        return NULL;
    }
    return path;
}

int tb_cli_serve(int argc, char **argv) {
    tb_serve_options o;
    tb_serve_options_default(&o);
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED_INT(lo, hi, dst) do { if (!(v && tb_cli_parse_int(v, lo, hi, dst))) { fprintf(stderr, "turbine: %s needs an integer in [%d, %d]\n", a, lo, hi); return 2; } i++; } while (0)
        if (!strcmp(a, "--host")) { if (!v) goto needs; o.host = v; i++; }
        else if (!strcmp(a, "--port")) NEED_INT(1, 65535, &o.port);
        else if (!strcmp(a, "--max-num-seqs")) NEED_INT(1, 4096, &o.max_num_seqs);
        else if (!strcmp(a, "--max-batched-tokens")) NEED_INT(1, 1 << 20, &o.max_batched_tokens);
        else if (!strcmp(a, "--max-queue")) NEED_INT(1, 1 << 20, &o.max_queue);
        else if (!strcmp(a, "--threads")) NEED_INT(1, 256, &o.threads);
        else if (!strcmp(a, "--timeout")) NEED_INT(1, 3600, &o.connection_timeout_s);
        else if (!strcmp(a, "--stream-interval")) NEED_INT(1, 4096, &o.stream_interval);
        else if (!strcmp(a, "--stream-buffer")) NEED_INT(1, 1 << 20, &o.stream_buffer);
        else if (!strcmp(a, "--kv-cache-mem")) {
            if (!v || !(o.kv_cache_bytes = parse_size(v))) { fprintf(stderr, "turbine: --kv-cache-mem needs a size such as 512MiB\n"); return 2; }
            i++;
        } else if (!strcmp(a, "--max-body")) {
            if (!v || !(o.max_body_bytes = parse_size(v))) { fprintf(stderr, "turbine: --max-body needs a size\n"); return 2; }
            i++;
        } else if (!strcmp(a, "--grace")) {
            int g; NEED_INT(1, 3600, &g); o.grace_seconds = g;
        } else if (!strcmp(a, "--api-key")) { if (!v) goto needs; o.api_key = v; i++; }
        else if (!strcmp(a, "--model-name") || !strcmp(a, "--served-model-name")) { if (!v) goto needs; o.model_name = v; i++; }
        else if (!strcmp(a, "--device")) { if (!v) goto needs; o.device = v; i++; }
        else if (!strcmp(a, "--no-prefix-caching") || !strcmp(a, "--no-enable-prefix-caching")) o.no_prefix_cache = 1;
        else if (!strcmp(a, "--enable-prefix-caching")) o.no_prefix_cache = 0;
        else if (!strcmp(a, "--gpu-memory-fraction")) {
            char *end = NULL;
            double f = v ? strtod(v, &end) : 0;
            if (!v || end == v || *end || !(f > 0 && f <= 1)) { fprintf(stderr, "turbine: --gpu-memory-fraction needs a number in (0, 1]\n"); return 2; }
            o.gpu_memory_fraction = f;
            i++;
        }
        else if (a[0] == '-') { fprintf(stderr, "turbine: unknown option '%s' for serve\n", a); return 2; }
        else if (!o.engine_path) o.engine_path = a;
        else { fprintf(stderr, "turbine: unexpected argument '%s'\n", a); return 2; }
        continue;
    needs:
        fprintf(stderr, "turbine: %s needs a value\n", a);
        return 2;
#undef NEED_INT
    }
    if (!o.api_key) o.api_key = getenv("TURBINE_API_KEY");
    char demo[PATH_MAX];
    if (!o.engine_path) {
        o.engine_path = demo_engine(demo, sizeof demo);
        if (!o.engine_path) return 1;
        if (!o.model_name) o.model_name = "shakespeare-demo";
    }
    return tb_serve_run(&o);
}
