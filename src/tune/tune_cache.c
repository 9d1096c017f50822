/*
 * tune_cache.c — tactics timed on this machine, kept on disk (tune_cache.h).
 */
#include "tune/tune_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"

#define HEADER "turbine-tune-cache 1 | "

static uint64_t fnv1a64(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

int tb_tune_cache_path(const char *ident, char *buf, size_t n) {
    if (!buf || n == 0) return 0;
    buf[0] = '\0';
    if (!ident) return 0;
    const char *env = getenv("TURBINE_TUNE_CACHE");
    char dir[PATH_MAX];
    if (env) {
        if (!*env || !strcmp(env, "off") || !strcmp(env, "0")) return 0;
        if (snprintf(dir, sizeof dir, "%s", env) >= (int)sizeof dir) return 0;
    } else {
        const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
        int w;
        if (xdg && xdg[0] == '/') w = snprintf(dir, sizeof dir, "%s/turbine", xdg);
        else if (home && home[0] == '/') w = snprintf(dir, sizeof dir, "%s/.cache/turbine", home);
        else return 0;
        if (w >= (int)sizeof dir) return 0;
    }
    size_t dl = strlen(dir);
    while (dl > 1 && dir[dl - 1] == '/') dir[--dl] = '\0';
    int w = snprintf(buf, n, "%s/tune-%016llx.txt", dir, (unsigned long long)fnv1a64(ident));
    if (w < 0 || (size_t)w >= n) {
        buf[0] = '\0';
        return 0;
    }
    return 1;
}

/* One record line (no newline) into v: 1 when it is tag followed by
 * exactly n_int integers, 0 for another tag, -1 when malformed. */
static int parse_line(const char *line, const char *tag, int n_int, int *v) {
    size_t tl = strlen(tag);
    const char *sp = strchr(line, ' ');
    if (!sp || sp == line) return -1;
    if ((size_t)(sp - line) != tl || memcmp(line, tag, tl)) return 0;
    const char *p = sp;
    for (int i = 0; i < n_int; i++) {
        if (*p != ' ') return -1;
        p++;
        if (!(*p == '-' || (*p >= '0' && *p <= '9'))) return -1;
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (end == p || errno || x < INT_MIN || x > INT_MAX) return -1;
        v[i] = (int)x;
        p = end;
    }
    return *p == '\0' ? 1 : -1;
}

int tb_tune_cache_read(const char *path, const char *ident, const char *tag, int n_int,
                       void (*fn)(void *user, const int *v), void *user, int *bad) {
    if (bad) *bad = 0;
    if (!path || !*path || !ident || !tag || n_int < 1 || n_int > TB_TUNE_CACHE_MAX_INTS) return -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT ? 0 : -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > TB_TUNE_CACHE_MAX_BYTES) {
        close(fd);
        return -1;
    }
    size_t cap = (size_t)st.st_size;
    char *b = malloc(cap + 1);
    if (!b) {
        close(fd);
        return -1;
    }
    size_t len = 0;
    while (len < cap) {
        ssize_t r = read(fd, b + len, cap - len);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        len += (size_t)r;
    }
    close(fd);
    b[len] = '\0';
    size_t hl = strlen(HEADER), il = strlen(ident);
    if (len < hl + il + 1 || memcmp(b, HEADER, hl) || memcmp(b + hl, ident, il) || b[hl + il] != '\n') {
        free(b);
        return 0; /* empty, or another identity's */
    }
    int count = 0, nbad = 0, v[TB_TUNE_CACHE_MAX_INTS];
    char *p = b + hl + il + 1, *endb = b + len;
    while (p < endb) {
        char *nl = memchr(p, '\n', (size_t)(endb - p));
        if (!nl) { /* cut short by a writer that stopped mid-line */
            nbad++;
            break;
        }
        *nl = '\0';
        if (memchr(p, '\0', (size_t)(nl - p))) {
            nbad++;
        } else if (*p) {
            int r = parse_line(p, tag, n_int, v);
            if (r < 0) nbad++;
            if (r > 0) {
                if (fn) fn(user, v);
                count++;
            }
        }
        p = nl + 1;
    }
    free(b);
    if (bad) *bad = nbad;
    return count;
}

int tb_tune_cache_open(const char *ident, char *path, size_t n, const char *tag, int n_int,
                       void (*fn)(void *user, const int *v), void *user, const char *what) {
    if (!tb_tune_cache_path(ident, path, n)) return 0;
    int bad = 0;
    int got = tb_tune_cache_read(path, ident, tag, n_int, fn, user, &bad);
    if (got < 0)
        tb_log(TB_LOG_WARN, "tune cache %s cannot be read; %s are timed again", path, what);
    else if (got > 0 || bad > 0)
        tb_log(TB_LOG_INFO, "%d %s read from %s%s", got, what, path, bad ? " (malformed lines skipped)" : "");
    return 1;
}

/* mkdir -p of path's folder */
static int make_dirs(const char *path) {
    char d[PATH_MAX];
    if (snprintf(d, sizeof d, "%s", path) >= (int)sizeof d) return -1;
    char *slash = strrchr(d, '/');
    if (!slash || slash == d) return 0;
    *slash = '\0';
    for (char *q = d + 1; *q; q++) {
        if (*q != '/') continue;
        *q = '\0';
        if (mkdir(d, 0755) != 0 && errno != EEXIST) return -1;
        *q = '/';
    }
    return mkdir(d, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

static int write_all(int fd, const char *s, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, s, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        s += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Creates path holding only its first line, atomically: written to a file of
 * its own and linked into place, so that no process ever sees the file
 * without it. 0 also when another process made it first. */
static int create_file(const char *path, const char *ident) {
    char tmp[PATH_MAX + 32];
    if (snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid()) >= (int)sizeof tmp) return -1;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    int ok = write_all(fd, HEADER, strlen(HEADER)) == 0 && write_all(fd, ident, strlen(ident)) == 0 &&
             write_all(fd, "\n", 1) == 0;
    ok = close(fd) == 0 && ok;
    int r = ok && (link(tmp, path) == 0 || errno == EEXIST) ? 0 : -1;
    unlink(tmp);
    return r;
}

static int warned;

static int fail(const char *path, const char *why) {
    if (!warned) {
        warned = 1;
        tb_log(TB_LOG_WARN, "tune cache %s: %s; timed picks are not kept", path, why);
    }
    return -1;
}

int tb_tune_cache_append(const char *path, const char *ident, const char *tag, int n_int, const int *v) {
    if (!path || !*path || !ident || !tag || !*tag || strchr(tag, ' ') || strchr(tag, '\n') || strchr(ident, '\n') ||
        n_int < 1 || n_int > TB_TUNE_CACHE_MAX_INTS || !v)
        return -1;
    char line[32 + 12 * TB_TUNE_CACHE_MAX_INTS];
    int w = snprintf(line, sizeof line, "%s", tag);
    if (w < 0 || w > 24) return -1;
    for (int i = 0; i < n_int; i++) w += snprintf(line + w, sizeof line - (size_t)w, " %d", v[i]);
    line[w++] = '\n';
    if (make_dirs(path) != 0) return fail(path, strerror(errno));
    int fd = open(path, O_RDWR | O_APPEND | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) {
        if (create_file(path, ident) != 0) return fail(path, strerror(errno));
        fd = open(path, O_RDWR | O_APPEND | O_CLOEXEC);
    }
    if (fd < 0) return fail(path, strerror(errno));
    /* the first line must name this identity (another's file is left alone) */
    size_t hl = strlen(HEADER), il = strlen(ident);
    char *head = malloc(hl + il + 1);
    ssize_t got = head ? pread(fd, head, hl + il + 1, 0) : -1;
    int mine = got == (ssize_t)(hl + il + 1) && !memcmp(head, HEADER, hl) && !memcmp(head + hl, ident, il) &&
               head[hl + il] == '\n';
    free(head);
    if (!mine) {
        close(fd);
        return fail(path, "the file holds another device's picks");
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size + w > TB_TUNE_CACHE_MAX_BYTES) {
        close(fd);
        return fail(path, "the file is full");
    }
    int r = write_all(fd, line, (size_t)w);
    if (close(fd) != 0) r = -1;
    return r == 0 ? 0 : fail(path, strerror(errno));
}
