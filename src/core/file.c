/* file.c — read-only mapping and small whole-file reads. */
#define _GNU_SOURCE
#include "core.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

tb_status tb_file_map(const char *path, tb_mapped_file *out) {
    memset(out, 0, sizeof *out);
    out->fd = -1;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return tb_errorf(TB_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return tb_errorf(TB_ERR_IO, "%s is not a regular file", path);
    }
    if (st.st_size == 0) {
        close(fd);
        return tb_errorf(TB_ERR_FORMAT, "%s is empty", path);
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        return tb_errorf(TB_ERR_IO, "cannot map %s: %s", path, strerror(errno));
    }
    out->data = p;
    out->size = (size_t)st.st_size;
    out->fd = fd;
    return TB_OK;
}

void tb_file_unmap(tb_mapped_file *m) {
    if (!m) return;
    if (m->data) munmap((void *)m->data, m->size);
    if (m->fd >= 0) close(m->fd);
    m->data = NULL;
    m->size = 0;
    m->fd = -1;
}

tb_status tb_file_read_all(const char *path, char **out, size_t *size, size_t max_size) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return tb_errorf(TB_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0) { fclose(f); return tb_errorf(TB_ERR_IO, "cannot seek %s", path); }
    long n = ftell(f);
    if (n < 0 || (size_t)n > max_size) {
        fclose(f);
        return tb_errorf(TB_ERR_FORMAT, "%s is larger than %zu bytes", path, max_size);
    }
    rewind(f);
    char *buf = malloc((size_t)n + 1);
    if (!buf) { fclose(f); return tb_errorf(TB_ERR_OOM, "out of memory reading %s", path); }
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        fclose(f);
        return tb_errorf(TB_ERR_IO, "cannot read %s", path);
    }
    fclose(f);
    buf[n] = 0;
    *out = buf;
    if (size) *size = (size_t)n;
    return TB_OK;
}

int tb_file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int tb_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

void *tb_dl_open_first(const char *const *names, char *err, size_t cap) {
    void *h = NULL;
    if (cap) err[0] = 0;
    for (int i = 0; names[i] && !h; i++) {
        dlerror();
        h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            const char *e = dlerror();
            snprintf(err, cap, "%s", e ? e : names[i]);
        }
    }
    return h;
}

int tb_all_zero(const void *p, size_t n) {
    const uint8_t *b = p;
    return n == 0 || (b[0] == 0 && memcmp(b, b + 1, n - 1) == 0);
}

void tb_file_release_pages(const void *p, size_t n) {
    if (!p || !n) return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)p, b = a + n;
    uintptr_t lo = (a + page - 1) / page * page, hi = b / page * page;
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
}
