/*
 * test_tune_cache.c — the on-disk cache of timed picks (tune/tune_cache.h):
 *   - the path: TURBINE_TUNE_CACHE names the folder, "off" / "0" / ""
 *     turn the cache off, unset falls back to $XDG_CACHE_HOME/turbine and
 *     then $HOME/.cache/turbine; two identities get two files;
 *   - records appended are read back in order, with their tag and count of
 *     integers (others skipped, not counted as bad), the missing folders
 *     made on the first append, the first line written once;
 *   - a file of another identity is read as empty and not appended to;
 *   - malformed lines (junk, too few / many numbers, out of int range, a
 *     line cut short at the end, a NUL byte) are skipped and counted, the
 *     good ones around them still read;
 *   - four processes appending 200 records each to one new file: one first
 *     line, all 800 records whole;
 *   - tb_tune_cache_open names the file and passes its records, and is 0
 *     with the cache turned off.
 */
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/core.h"
#include "tb_test.h"
#include "tune/tune_cache.h"

static void collect(void *user, const int *v) {
    int *acc = user; /* acc[0]: count, then 3 ints a record (at most 1000) */
    if (acc[0] < 1000) memcpy(&acc[1 + 3 * acc[0]], v, 3 * sizeof *v);
    acc[0]++;
}

static int acc[1 + 3 * 1000];

static int read3(const char *path, const char *ident, int *bad) {
    memset(acc, 0, sizeof acc);
    return tb_tune_cache_read(path, ident, "lt", 3, collect, acc, bad);
}

static void append_raw(const char *path, const char *s) {
    FILE *f = fopen(path, "ab");
    CHECK(f != NULL);
    if (f) {
        fwrite(s, 1, strlen(s), f);
        fclose(f);
    }
}

int main(void) {
    char root[512], dir[600], path[1024], path2[1024];
    snprintf(root, sizeof root, "%s/tune_cache_test.%ld", tb_test_tmp(), (long)getpid());
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    CHECK(system(cmd) == 0);
    const char *id = "gpu=Test GPU cc=9.0 sms=132 lib=130100 plan=1";
    const char *id2 = "gpu=Other GPU cc=8.0 sms=108 lib=130100 plan=1";

    /* where */
    setenv("TURBINE_TUNE_CACHE", "off", 1);
    CHECK(tb_tune_cache_path(id, path, sizeof path) == 0 && path[0] == '\0');
    setenv("TURBINE_TUNE_CACHE", "0", 1);
    CHECK(tb_tune_cache_path(id, path, sizeof path) == 0);
    setenv("TURBINE_TUNE_CACHE", "", 1);
    CHECK(tb_tune_cache_path(id, path, sizeof path) == 0);
    unsetenv("TURBINE_TUNE_CACHE");
    setenv("XDG_CACHE_HOME", "/x/cache", 1);
    CHECK(tb_tune_cache_path(id, path, sizeof path) == 1 && !strncmp(path, "/x/cache/turbine/tune-", 22) &&
          strlen(path) == 22 + 16 + 4 && !strcmp(path + 38, ".txt"));
    unsetenv("XDG_CACHE_HOME");
    setenv("HOME", "/home/u", 1);
    CHECK(tb_tune_cache_path(id, path, sizeof path) == 1 && !strncmp(path, "/home/u/.cache/turbine/tune-", 28));
    setenv("HOME", "relative", 1);
    CHECK(tb_tune_cache_path(id, path, sizeof path) == 0);
    char small[16];
    CHECK(tb_tune_cache_path(id, small, sizeof small) == 0 && small[0] == '\0');

    snprintf(dir, sizeof dir, "%s/a/b/", root); /* folders not there yet, a trailing slash */
    setenv("TURBINE_TUNE_CACHE", dir, 1);
    CHECK(tb_tune_cache_path(id, path, sizeof path) == 1);
    CHECK(tb_tune_cache_path(id2, path2, sizeof path2) == 1 && strcmp(path, path2) != 0);
    CHECK(strstr(path, "/a/b/tune-") != NULL && strstr(path, "//") == NULL);

    /* nothing yet */
    int bad = -1;
    CHECK(read3(path, id, &bad) == 0 && bad == 0 && acc[0] == 0);

    /* append, read back */
    for (int i = 0; i < 10; i++) {
        int v[3] = {16 * (i + 1), 4096, i};
        CHECK(tb_tune_cache_append(path, id, "lt", 3, v) == 0);
    }
    int w4[4] = {1, 2, 3, 4};
    CHECK(tb_tune_cache_append(path, id, "lt", 4, w4) == 0); /* same tag, 4 numbers: not a 3-record */
    int o[3] = {7, 7, 7};
    CHECK(tb_tune_cache_append(path, id, "gemv", 3, o) == 0);
    CHECK(tb_tune_cache_append(path, id, "bad tag", 3, o) == -1);
    CHECK(tb_tune_cache_append(path, "two\nlines", "lt", 3, o) == -1);
    int n = read3(path, id, &bad);
    CHECK_MSG(n == 10 && acc[0] == 10, "read %d", n);
    CHECK(bad == 1); /* the 4-number lt line */
    int in_order = 1;
    for (int i = 0; i < 10; i++) in_order &= acc[1 + 3 * i] == 16 * (i + 1) && acc[2 + 3 * i] == 4096 && acc[3 + 3 * i] == i;
    CHECK(in_order);
    memset(acc, 0, sizeof acc);
    CHECK(tb_tune_cache_read(path, id, "gemv", 3, collect, acc, &bad) == 1 && acc[1] == 7);
    FILE *f = fopen(path, "rb");
    char first[256] = {0};
    CHECK(f && fgets(first, sizeof first, f));
    if (f) fclose(f);
    char want[256];
    snprintf(want, sizeof want, "turbine-tune-cache 1 | %s\n", id);
    CHECK(!strcmp(first, want));

    /* another identity: read as empty, left alone */
    CHECK(read3(path, id2, &bad) == 0 && acc[0] == 0);
    struct stat st0, st1;
    CHECK(stat(path, &st0) == 0);
    tb_log_set_level(TB_LOG_ERROR); /* the refusal's warning */
    CHECK(tb_tune_cache_append(path, id2, "lt", 3, o) == -1);
    tb_log_set_level(TB_LOG_WARN);
    CHECK(stat(path, &st1) == 0 && st1.st_size == st0.st_size);
    CHECK(read3(path2, id2, &bad) == 0); /* its own file: not there */
    CHECK(tb_tune_cache_append(path2, id2, "lt", 3, o) == 0 && read3(path2, id2, &bad) == 1);

    /* malformed lines skipped, counted; the good ones around them read */
    append_raw(path, "lt 1 2\n");            /* too few */
    append_raw(path, "lt 1 2 3 4 5\n");      /* too many */
    append_raw(path, "lt 1 x 3\n");          /* not a number */
    append_raw(path, "lt 1 2 99999999999\n"); /* past int */
    append_raw(path, "lt  1 2 3\n");         /* two spaces */
    append_raw(path, "lt 1 2 3 \n");         /* trailing space */
    append_raw(path, "garbage\n");           /* no tag */
    append_raw(path, "\n");                  /* empty: ignored */
    append_raw(path, "lt -5 6 7\n");         /* good */
    {
        FILE *g = fopen(path, "ab");
        if (g) {
            fwrite("lt 1\0002 3\n", 1, 9, g); /* a NUL byte inside */
            fclose(g);
        }
    }
    append_raw(path, "lt 8 9 10\n");         /* good */
    append_raw(path, "lt 11 12 1");          /* cut short at the end */
    n = read3(path, id, &bad);
    CHECK_MSG(n == 12 && bad == 1 + 7 + 1 + 1, "read %d, bad %d", n, bad);
    CHECK(acc[1 + 3 * 10] == -5 && acc[1 + 3 * 11] == 8 && acc[3 + 3 * 11] == 10);

    /* a file too large is not read, nor appended to; a folder as the path cannot be read */
    char big[1100];
    snprintf(big, sizeof big, "%s/big.txt", root);
    f = fopen(big, "wb");
    if (f) {
        fprintf(f, "turbine-tune-cache 1 | %s\n", id);
        for (int i = 0; i < 500000; i++) fputs("lt 1 2 3\n", f);
        fclose(f);
    }
    CHECK(tb_tune_cache_read(big, id, "lt", 3, collect, acc, &bad) == -1);
    tb_log_set_level(TB_LOG_ERROR);
    CHECK(tb_tune_cache_append(big, id, "lt", 3, o) == -1);
    tb_log_set_level(TB_LOG_WARN);
    CHECK(tb_tune_cache_read(dir, id, "lt", 3, collect, acc, &bad) == -1);
    CHECK(tb_tune_cache_read(path, id, "lt", 0, collect, acc, &bad) == -1);

    /* four processes appending to one new file at once */
    char shared[1024];
    snprintf(shared, sizeof shared, "%s/c/d", root);
    setenv("TURBINE_TUNE_CACHE", shared, 1);
    const char *id3 = "gpu=Concurrent cc=9.0";
    char path3[1024];
    CHECK(tb_tune_cache_path(id3, path3, sizeof path3) == 1);
    pid_t kids[4];
    for (int k = 0; k < 4; k++) {
        kids[k] = fork();
        if (kids[k] == 0) {
            int okc = 1;
            for (int i = 0; i < 200; i++) {
                int v[3] = {k, i, 1000000 + k * 1000 + i};
                okc &= tb_tune_cache_append(path3, id3, "lt", 3, v) == 0;
            }
            _exit(okc ? 0 : 1);
        }
    }
    int all_ok = 1;
    for (int k = 0; k < 4; k++) {
        int stt = 0;
        all_ok &= kids[k] > 0 && waitpid(kids[k], &stt, 0) == kids[k] && WIFEXITED(stt) && WEXITSTATUS(stt) == 0;
    }
    CHECK(all_ok);
    n = read3(path3, id3, &bad);
    CHECK_MSG(n == 800 && bad == 0, "concurrent: read %d, bad %d", n, bad);
    int seen[4][200];
    memset(seen, 0, sizeof seen);
    int whole = 1;
    for (int i = 0; i < 800 && i < 1000; i++) {
        int k = acc[1 + 3 * i], j = acc[2 + 3 * i];
        if (k < 0 || k > 3 || j < 0 || j > 199 || acc[3 + 3 * i] != 1000000 + k * 1000 + j) whole = 0;
        else seen[k][j]++;
    }
    for (int k = 0; k < 4; k++)
        for (int j = 0; j < 200; j++) whole &= seen[k][j] == 1;
    CHECK(whole);
    f = fopen(path3, "rb");
    int headers = 0;
    char line[256];
    while (f && fgets(line, sizeof line, f)) headers += !strncmp(line, "turbine-tune-cache", 18);
    if (f) fclose(f);
    CHECK(headers == 1);

    /* open: names the file and reads its records (as a backend does) */
    char path4[1024];
    memset(acc, 0, sizeof acc);
    CHECK(tb_tune_cache_open(id3, path4, sizeof path4, "lt", 3, collect, acc, "test picks") == 1);
    CHECK(!strcmp(path4, path3) && acc[0] == 800);
    memset(acc, 0, sizeof acc);
    CHECK(tb_tune_cache_open(id3, path4, sizeof path4, "lt", 4, collect, acc, "test picks") == 1 && acc[0] == 0);
    setenv("TURBINE_TUNE_CACHE", "off", 1);
    CHECK(tb_tune_cache_open(id3, path4, sizeof path4, "lt", 3, collect, acc, "test picks") == 0 && path4[0] == '\0' &&
          acc[0] == 0);

    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    CHECK(system(cmd) == 0);
    return tb_test_finish("test_tune_cache");
}
