/*
 * test_model_repo.c — config.json parsing and repository scanning
 * (serve/model_repo.c) over a repository written into a temp folder: good
 * models with each version policy, engine and ONNX files, a model without
 * a config; and one model folder per malformed case (bad JSON, unknown
 * fields, wrong types, out-of-range values, a name that differs from the
 * folder, bad policies, a missing version or model file, a bad model name)
 * each reported with its own error while the good ones scan fine. Then the
 * parser alone on every field's edge, and the config turned into batcher
 * settings.
 */
#include <sys/stat.h>
#include <unistd.h>

#include "serve/model_repo.h"
#include "tb_test.h"

static char root[512];

static void mkdirs(const char *rel) {
    char p[1024], cur[1024];
    snprintf(p, sizeof p, "%s/%s", root, rel);
    size_t n = strlen(p);
    for (size_t i = 1; i <= n; i++)
        if (p[i] == '/' || p[i] == 0) {
            memcpy(cur, p, i);
            cur[i] = 0;
            mkdir(cur, 0755);
        }
}

static void put(const char *rel, const char *text) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", root, rel);
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", rel);
    char *slash = strrchr(dir, '/');
    if (slash) {
        *slash = 0;
        mkdirs(dir);
    }
    FILE *f = fopen(p, "wb");
    CHECK_MSG(f != NULL, "cannot write %s", p);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

/* A model folder with version 1 holding an engine and the given config. */
static void bad_model(const char *name, const char *config) {
    char p[256];
    snprintf(p, sizeof p, "%s/1/model.engine", name);
    put(p, "x");
    snprintf(p, sizeof p, "%s/config.json", name);
    put(p, config);
}

static const tb_model_entry *expect_error(const tb_model_repo *r, const char *name, const char *needle) {
    const tb_model_entry *m = tb_model_repo_find(r, name);
    CHECK_MSG(m != NULL, "model %s not listed", name);
    if (!m) return NULL;
    CHECK_MSG(m->status != TB_OK, "model %s scanned fine", name);
    CHECK_MSG(strstr(m->error, needle) != NULL, "model %s: error '%s' lacks '%s'", name, m->error, needle);
    CHECK(m->n_versions == 0 && m->versions == NULL);
    return m;
}

static void test_repository(void) {
    snprintf(root, sizeof root, "%s/model_repo_%d", tb_test_tmp(), (int)getpid());
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    CHECK(system(cmd) == 0);
    mkdir(root, 0755);

    /* good: three versions, latest 2, full batcher settings */
    put("resnet/1/model.engine", "e");
    put("resnet/2/model.onnx", "o");
    put("resnet/3/model.engine", "e");
    put("resnet/3/model.onnx", "o"); /* the engine wins */
    put("resnet/config.json",
        "{\"name\": \"resnet\", \"max_batch_size\": 8,\n"
        " \"dynamic_batching\": {\"preferred_batch_size\": [4, 8], \"max_queue_delay_microseconds\": 2000,\n"
        "   \"default_queue_policy\": {\"max_queue_size\": 64, \"default_timeout_microseconds\": 100000,\n"
        "     \"timeout_action\": \"REJECT\", \"allow_timeout_override\": true}},\n"
        " \"instance_group\": [{\"count\": 2, \"kind\": \"KIND_CPU\", \"threads\": 1}],\n"
        " \"version_policy\": {\"latest\": {\"num_versions\": 2}},\n"
        " \"build\": {\"dtype\": \"int8\", \"shapes\": \"input:1x3x32x32\", \"calib_data\": \"calib\"}}\n");
    /* good: no config, versions 1 and 10 (numeric order, not text), a
     * non-version folder and a note ignored */
    put("plain/1/model.onnx", "o");
    put("plain/10/model.onnx", "o");
    put("plain/extra/model.onnx", "o");
    put("plain/01/model.onnx", "o");
    put("plain/README", "notes");
    /* good: all versions; specific versions */
    put("every/2/model.engine", "e");
    put("every/5/model.engine", "e");
    put("every/config.json", "{\"version_policy\": {\"all\": {}}, \"instance_group\": [{\"kind\": \"KIND_GPU\", "
                             "\"gpus\": [1]}]}");
    put("some/1/model.engine", "e");
    put("some/2/model.engine", "e");
    put("some/3/model.engine", "e");
    put("some/config.json", "{\"version_policy\": {\"specific\": {\"versions\": [3, 1]}}}");
    /* skipped: hidden folders and plain files at the top */
    put(".hidden/1/model.engine", "e");
    put("README.md", "a repository");

    /* malformed, one model each */
    bad_model("badjson", "{\"max_batch_size\": 8,,}");
    bad_model("unknown", "{\"max_batch_sizes\": 8}");
    bad_model("wrongtype", "{\"max_batch_size\": \"8\"}");
    bad_model("negative", "{\"max_batch_size\": -1}");
    bad_model("toolarge", "{\"max_batch_size\": 100000}");
    bad_model("prefabove", "{\"max_batch_size\": 4, \"dynamic_batching\": {\"preferred_batch_size\": [8]}}");
    bad_model("prefnotarray", "{\"max_batch_size\": 4, \"dynamic_batching\": {\"preferred_batch_size\": 4}}");
    bad_model("delayneg", "{\"max_batch_size\": 4, \"dynamic_batching\": {\"max_queue_delay_microseconds\": -5}}");
    bad_model("dynunknown", "{\"max_batch_size\": 4, \"dynamic_batching\": {\"priority_levels\": 2}}");
    bad_model("delayaction",
              "{\"dynamic_batching\": {\"default_queue_policy\": {\"timeout_action\": \"DELAY\"}}}");
    bad_model("overridetype",
              "{\"dynamic_batching\": {\"default_queue_policy\": {\"allow_timeout_override\": 1}}}");
    bad_model("othername", "{\"name\": \"resnet\"}");
    bad_model("twopolicies", "{\"version_policy\": {\"all\": {}, \"latest\": {\"num_versions\": 1}}}");
    bad_model("zerolatest", "{\"version_policy\": {\"latest\": {\"num_versions\": 0}}}");
    bad_model("nolatestn", "{\"version_policy\": {\"latest\": {}}}");
    bad_model("oddpolicy", "{\"version_policy\": {\"newest\": {}}}");
    bad_model("dupversion", "{\"version_policy\": {\"specific\": {\"versions\": [1, 1]}}}");
    bad_model("missingversion", "{\"version_policy\": {\"specific\": {\"versions\": [1, 7]}}}");
    bad_model("zerocount", "{\"instance_group\": [{\"count\": 0}]}");
    bad_model("twogroups", "{\"instance_group\": [{\"count\": 1}, {\"count\": 1}]}");
    bad_model("oddkind", "{\"instance_group\": [{\"kind\": \"KIND_TPU\"}]}");
    bad_model("cpugpus", "{\"instance_group\": [{\"kind\": \"KIND_CPU\", \"gpus\": [0]}]}");
    bad_model("baddtype", "{\"build\": {\"dtype\": \"int4\"}}");
    bad_model("shapesboth", "{\"build\": {\"shapes\": \"x:1x2\", \"max_shapes\": \"x:4x2\"}}");
    bad_model("notobject", "[1, 2]");
    bad_model("dupkey", "{\"max_batch_size\": 1, \"max_batch_size\": 2}");
    bad_model("empty", "");
    put("noversions/config.json", "{}");
    put("nofile/1/weights.bin", "w");
    put("bad name/1/model.engine", "e");
    mkdirs("confdir/config.json");
    put("confdir/1/model.engine", "e");

    tb_model_repo r;
    tb_status s = tb_model_repo_scan(root, &r);
    CHECK_MSG(s == TB_OK, "scan: %s", tb_last_error());
    CHECK_MSG(r.n_models == 35, "%d models", r.n_models);
    for (int i = 1; i < r.n_models; i++) CHECK(strcmp(r.models[i - 1].name, r.models[i].name) < 0);
    CHECK(tb_model_repo_find(&r, ".hidden") == NULL && tb_model_repo_find(&r, "README.md") == NULL);

    const tb_model_entry *m = tb_model_repo_find(&r, "resnet");
    CHECK(m && m->status == TB_OK);
    if (m && m->status == TB_OK) {
        const tb_repo_config *c = &m->config;
        CHECK(m->n_versions == 2 && m->versions[0].version == 2 && m->versions[1].version == 3);
        CHECK(m->versions[0].is_onnx && strstr(m->versions[0].path, "/resnet/2/model.onnx"));
        CHECK(!m->versions[1].is_onnx && strstr(m->versions[1].path, "/resnet/3/model.engine"));
        CHECK(c->max_batch_size == 8 && c->dynamic_batching && c->n_preferred == 2 &&
              c->preferred_batch_size[0] == 4 && c->preferred_batch_size[1] == 8);
        CHECK(c->max_queue_delay_us == 2000 && c->max_queue_size == 64 && c->default_timeout_us == 100000);
        CHECK(c->allow_timeout_override == 1 && c->instance_count == 2 && c->threads_per_instance == 1);
        CHECK(!strcmp(c->device, "cpu") && c->dtype == TB_I8 && !strcmp(c->shapes, "input:1x3x32x32"));
        CHECK_MSG(strstr(c->calib_data, "/resnet/calib") && c->calib_data[0] == '/', "calib %s", c->calib_data);
        tb_batcher_config bc;
        tb_repo_config_batcher(c, &bc);
        CHECK(bc.max_batch_size == 8 && bc.n_preferred == 2 && bc.preferred_batch_size[1] == 8);
        CHECK(bc.max_queue_delay_us == 2000 && bc.max_queue_size == 64 && bc.default_timeout_us == 100000);
        CHECK(bc.instance_count == 2 && bc.threads_per_instance == 1 && bc.device && !strcmp(bc.device, "cpu"));
    }
    m = tb_model_repo_find(&r, "plain");
    CHECK(m && m->status == TB_OK);
    if (m && m->status == TB_OK) {
        CHECK(m->n_versions == 1 && m->versions[0].version == 10 && m->versions[0].is_onnx);
        CHECK(m->config.max_batch_size == 0 && !m->config.dynamic_batching && m->config.instance_count == 1);
        CHECK(m->config.dtype == TB_F32 && m->config.device[0] == 0);
        tb_batcher_config bc;
        tb_repo_config_batcher(&m->config, &bc);
        CHECK(bc.max_batch_size == 1 && bc.device == NULL && bc.max_queue_size == 0);
    }
    m = tb_model_repo_find(&r, "every");
    CHECK(m && m->status == TB_OK && m->n_versions == 2 && m->versions[0].version == 2 &&
          m->versions[1].version == 5 && !strcmp(m->config.device, "cuda:1"));
    m = tb_model_repo_find(&r, "some");
    CHECK(m && m->status == TB_OK && m->n_versions == 2 && m->versions[0].version == 1 &&
          m->versions[1].version == 3);

    expect_error(&r, "badjson", "line 1");
    expect_error(&r, "unknown", "unknown field 'max_batch_sizes'");
    expect_error(&r, "wrongtype", "'max_batch_size' is not an integer");
    expect_error(&r, "negative", "outside");
    expect_error(&r, "toolarge", "outside");
    expect_error(&r, "prefabove", "preferred batch size 8");
    expect_error(&r, "prefnotarray", "not an array");
    expect_error(&r, "delayneg", "max_queue_delay_microseconds");
    expect_error(&r, "dynunknown", "priority_levels");
    expect_error(&r, "delayaction", "REJECT");
    expect_error(&r, "overridetype", "boolean");
    expect_error(&r, "othername", "folder is 'othername'");
    expect_error(&r, "twopolicies", "exactly one");
    expect_error(&r, "zerolatest", "num_versions");
    expect_error(&r, "nolatestn", "needs 'num_versions'");
    expect_error(&r, "oddpolicy", "newest");
    expect_error(&r, "dupversion", "twice");
    expect_error(&r, "missingversion", "version 7");
    expect_error(&r, "zerocount", "count");
    expect_error(&r, "twogroups", "one is supported");
    expect_error(&r, "oddkind", "KIND_TPU");
    expect_error(&r, "cpugpus", "KIND_CPU");
    expect_error(&r, "baddtype", "int4");
    expect_error(&r, "shapesboth", "shapes");
    expect_error(&r, "notobject", "not a JSON object");
    expect_error(&r, "dupkey", "duplicate");
    expect_error(&r, "empty", "JSON error");
    expect_error(&r, "noversions", "no version folder");
    expect_error(&r, "nofile", "neither model.engine nor model.onnx");
    expect_error(&r, "bad name", "model name");
    expect_error(&r, "confdir", "not a plain file");
    m = tb_model_repo_find(&r, "badjson");
    if (m) CHECK(m->status == TB_ERR_FORMAT && strstr(m->error, "config.json"));
    m = tb_model_repo_find(&r, "nofile");
    if (m) CHECK(m->status == TB_ERR_NOT_FOUND);
    tb_model_repo_free(&r);
    tb_model_repo_free(&r); /* twice is fine */

    /* one model at a time, as a load request does */
    tb_model_entry one;
    CHECK(tb_model_repo_scan_model(root, "some", &one) == TB_OK && one.status == TB_OK && one.n_versions == 2);
    tb_model_entry_free(&one);
    CHECK(tb_model_repo_scan_model(root, "unknown", &one) == TB_OK && one.status == TB_ERR_FORMAT);
    tb_model_entry_free(&one);
    CHECK(tb_model_repo_scan_model(root, "absent", &one) == TB_ERR_NOT_FOUND);
    CHECK(tb_model_repo_scan_model(root, "../model_repo", &one) == TB_ERR_NOT_FOUND);
    CHECK(tb_model_repo_scan_model(root, "README.md", &one) == TB_ERR_NOT_FOUND);

    /* a missing repository fails the scan as a whole */
    char missing[700];
    snprintf(missing, sizeof missing, "%s/none", root);
    CHECK(tb_model_repo_scan(missing, &r) == TB_ERR_NOT_FOUND && r.n_models == 0);

    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    CHECK(system(cmd) == 0);
}

/* The parser alone: defaults, limits, text that is not NUL-terminated. */
static void test_parse(void) {
    tb_repo_config c;
    CHECK(tb_repo_config_parse("{}", 2, NULL, &c) == TB_OK);
    CHECK(c.max_batch_size == 0 && c.instance_count == 1 && c.policy == TB_VERSIONS_LATEST && c.latest_n == 1);
    const char buf[] = "{\"max_batch_size\": 4}garbage";
    CHECK(tb_repo_config_parse(buf, 21, "m", &c) == TB_OK && c.max_batch_size == 4);
    CHECK(tb_repo_config_parse(buf, sizeof buf - 1, "m", &c) == TB_ERR_FORMAT);
    CHECK(c.max_batch_size == 0); /* a failed parse leaves the defaults */
    /* name check only with a folder name */
    CHECK(tb_repo_config_parse("{\"name\": \"x\"}", 13, NULL, &c) == TB_OK);
    /* the bound on the file's size */
    size_t big = TB_MODEL_CONFIG_MAX_BYTES + 1;
    char *t = malloc(big);
    memset(t, ' ', big);
    t[0] = '{';
    t[big - 1] = '}';
    CHECK(tb_repo_config_parse(t, big, NULL, &c) == TB_ERR_FORMAT && strstr(tb_last_error(), "larger"));
    free(t);
    /* warmup: auto by default, on / off / booleans, nothing else */
    CHECK(tb_repo_config_parse("{}", 2, NULL, &c) == TB_OK && c.warmup == -1);
    const char *wk[] = {"{\"warmup\": \"on\"}", "{\"warmup\": false}", "{\"warmup\": \"auto\"}", "{\"warmup\": true}"};
    const int wv[] = {1, 0, -1, 1};
    for (int i = 0; i < 4; i++) {
        CHECK_MSG(tb_repo_config_parse(wk[i], strlen(wk[i]), NULL, &c) == TB_OK && c.warmup == wv[i], "%s", wk[i]);
        tb_batcher_config bc;
        tb_repo_config_batcher(&c, &bc);
        CHECK(bc.warmup == wv[i]);
    }
    const char *wbad = "{\"warmup\": 2}";
    CHECK(tb_repo_config_parse(wbad, strlen(wbad), NULL, &c) == TB_ERR_FORMAT && strstr(tb_last_error(), "warmup"));
    /* limits: 64 instances, 16 preferred sizes, 60 s delay */
    const char *d = "{\"instance_group\": [{\"count\": 65}]}";
    CHECK(tb_repo_config_parse(d, strlen(d), NULL, &c) == TB_ERR_FORMAT);
    d = "{\"max_batch_size\": 8, \"dynamic_batching\": {\"max_queue_delay_microseconds\": 60000001}}";
    CHECK(tb_repo_config_parse(d, strlen(d), NULL, &c) == TB_ERR_FORMAT);
    d = "{\"max_batch_size\": 2, \"dynamic_batching\": {\"preferred_batch_size\": "
        "[1,2,1,2,1,2,1,2,1,2,1,2,1,2,1,2,1]}}";
    CHECK(tb_repo_config_parse(d, strlen(d), NULL, &c) == TB_ERR_FORMAT && strstr(tb_last_error(), "16"));
    /* dynamic batching with max_batch_size 1: no merging */
    d = "{\"max_batch_size\": 1, \"dynamic_batching\": {}}";
    CHECK(tb_repo_config_parse(d, strlen(d), NULL, &c) == TB_OK && c.dynamic_batching);
    tb_batcher_config bc;
    tb_repo_config_batcher(&c, &bc);
    CHECK(bc.max_batch_size == 1);
    d = "{\"build\": {\"dtype\": \"f16\", \"min_shapes\": \"x:1x8\", \"max_shapes\": \"x:8x8\"}}";
    CHECK(tb_repo_config_parse(d, strlen(d), NULL, &c) == TB_OK && c.dtype == TB_F16 &&
          !strcmp(c.max_shapes, "x:8x8"));
}

int main(void) {
    test_repository();
    test_parse();
    printf("test_model_repo: %d checks, %d failures\n", tb_test_checks, tb_test_failures);
    return tb_test_failures ? 1 : 0;
}
