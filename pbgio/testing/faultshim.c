/* LD_PRELOAD shim: the OS refuses writes to chosen files, as a full disk or a failing device does.
 *
 * Built and driven by pbgio.testing.faults. Environment:
 *   PBG_FAULT        enospc (write or fallocate fails: no space) | eio (write fails: I/O error)
 *                    | eio-fsync (fsync fails: I/O error) | erofs (opening for writing and mkdir fail)
 *   PBG_FAULT_MATCH  only paths containing this string are affected
 *   PBG_FAULT_AFTER  bytes written to affected files before the fault starts (default 0)
 *   PBG_FAULT_LOG    a file to which the first refused call appends one line (so a test knows)
 * Once started, a fault stays (a full disk stays full).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static long long written = 0;
static int fired = 0;

static const char *mode(void) { const char *m = getenv("PBG_FAULT"); return m ? m : ""; }

static int matches_path(const char *path) {
    const char *match = getenv("PBG_FAULT_MATCH");
    return path && match && *match && strstr(path, match) != NULL;
}

static int matches_fd(int fd) {
    char link[64], target[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n <= 0) return 0;
    target[n] = 0;
    return matches_path(target);
}

static void note(const char *what, const char *where) {
    if (fired) return;
    fired = 1;
    const char *log = getenv("PBG_FAULT_LOG");
    if (!log) return;
    int (*real_open)(const char *, int, ...) = dlsym(RTLD_NEXT, "open");
    int fd = real_open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd < 0) return;
    char line[4400];
    int len = snprintf(line, sizeof line, "%s %s pid=%d\n", what, where, (int)getpid());
    ssize_t (*real_write)(int, const void *, size_t) = dlsym(RTLD_NEXT, "write");
    if (real_write(fd, line, (size_t)len) < 0) { /* nothing to do */ }
    close(fd);
}

/* Whether a write of n bytes to fd must fail now (and with which errno). */
static int write_fault(int fd, size_t n) {
    const char *m = mode();
    int err = strcmp(m, "enospc") == 0 ? ENOSPC : strcmp(m, "eio") == 0 ? EIO : 0;
    if (!err || !matches_fd(fd)) return 0;
    const char *after = getenv("PBG_FAULT_AFTER");
    long long limit = after ? atoll(after) : 0;
    if (!fired && written + (long long)n <= limit) { written += (long long)n; return 0; }
    char where[64];
    snprintf(where, sizeof where, "fd=%d", fd);
    note(m, where);
    return err;
}

#define WRITE_GUARD(fd, n)                 \
    do {                                   \
        int e_ = write_fault((fd), (n));   \
        if (e_) { errno = e_; return -1; } \
    } while (0)

ssize_t write(int fd, const void *buf, size_t n) {
    static ssize_t (*real)(int, const void *, size_t);
    if (!real) real = dlsym(RTLD_NEXT, "write");
    WRITE_GUARD(fd, n);
    return real(fd, buf, n);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) {
    static ssize_t (*real)(int, const void *, size_t, off_t);
    if (!real) real = dlsym(RTLD_NEXT, "pwrite");
    WRITE_GUARD(fd, n);
    return real(fd, buf, n, off);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off) {
    static ssize_t (*real)(int, const void *, size_t, off_t);
    if (!real) real = dlsym(RTLD_NEXT, "pwrite64");
    WRITE_GUARD(fd, n);
    return real(fd, buf, n, off);
}

static size_t iov_bytes(const struct iovec *iov, int count) {
    size_t total = 0;
    for (int i = 0; i < count; i++) total += iov[i].iov_len;
    return total;
}

ssize_t writev(int fd, const struct iovec *iov, int count) {
    static ssize_t (*real)(int, const struct iovec *, int);
    if (!real) real = dlsym(RTLD_NEXT, "writev");
    WRITE_GUARD(fd, iov_bytes(iov, count));
    return real(fd, iov, count);
}

ssize_t pwritev(int fd, const struct iovec *iov, int count, off_t off) {
    static ssize_t (*real)(int, const struct iovec *, int, off_t);
    if (!real) real = dlsym(RTLD_NEXT, "pwritev");
    WRITE_GUARD(fd, iov_bytes(iov, count));
    return real(fd, iov, count, off);
}

ssize_t sendfile(int out, int in, off_t *off, size_t n) {
    static ssize_t (*real)(int, int, off_t *, size_t);
    if (!real) real = dlsym(RTLD_NEXT, "sendfile");
    WRITE_GUARD(out, n);
    return real(out, in, off, n);
}

ssize_t sendfile64(int out, int in, off_t *off, size_t n) {
    static ssize_t (*real)(int, int, off_t *, size_t);
    if (!real) real = dlsym(RTLD_NEXT, "sendfile64");
    WRITE_GUARD(out, n);
    return real(out, in, off, n);
}

ssize_t copy_file_range(int in, off_t *in_off, int out, off_t *out_off, size_t n, unsigned int flags) {
    static ssize_t (*real)(int, off_t *, int, off_t *, size_t, unsigned int);
    if (!real) real = dlsym(RTLD_NEXT, "copy_file_range");
    WRITE_GUARD(out, n);
    return real(in, in_off, out, out_off, n, flags);
}

/* Reserving space (posix_fallocate returns the error; fallocate sets errno). */
int posix_fallocate(int fd, off_t off, off_t len) {
    static int (*real)(int, off_t, off_t);
    if (!real) real = dlsym(RTLD_NEXT, "posix_fallocate");
    int e = write_fault(fd, (size_t)len);
    return e ? e : real(fd, off, len);
}

int posix_fallocate64(int fd, off_t off, off_t len) {
    static int (*real)(int, off_t, off_t);
    if (!real) real = dlsym(RTLD_NEXT, "posix_fallocate64");
    int e = write_fault(fd, (size_t)len);
    return e ? e : real(fd, off, len);
}

int fallocate(int fd, int flags, off_t off, off_t len) {
    static int (*real)(int, int, off_t, off_t);
    if (!real) real = dlsym(RTLD_NEXT, "fallocate");
    WRITE_GUARD(fd, (size_t)len);
    return real(fd, flags, off, len);
}

static int sync_fault(int fd) {
    if (strcmp(mode(), "eio-fsync") != 0 || !matches_fd(fd)) return 0;
    char where[64];
    snprintf(where, sizeof where, "fsync fd=%d", fd);
    note("eio-fsync", where);
    return EIO;
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = dlsym(RTLD_NEXT, "fsync");
    int e = sync_fault(fd);
    if (e) { errno = e; return -1; }
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = dlsym(RTLD_NEXT, "fdatasync");
    int e = sync_fault(fd);
    if (e) { errno = e; return -1; }
    return real(fd);
}

static int open_fault(const char *path, int flags) {
    if (strcmp(mode(), "erofs") != 0 || !(flags & (O_WRONLY | O_RDWR | O_CREAT)) || !matches_path(path)) return 0;
    note("erofs", path);
    return EROFS;
}

#define OPEN_BODY(name, ...)                                   \
    static int (*real)();                                      \
    if (!real) real = dlsym(RTLD_NEXT, name);                  \
    mode_t mode_ = 0;                                          \
    if (flags & (O_CREAT | O_TMPFILE)) {                       \
        va_list ap;                                            \
        va_start(ap, flags);                                   \
        mode_ = va_arg(ap, mode_t);                            \
        va_end(ap);                                            \
    }                                                          \
    int e_ = open_fault(path, flags);                          \
    if (e_) { errno = e_; return -1; }                         \
    return real(__VA_ARGS__, mode_);

int open(const char *path, int flags, ...) { OPEN_BODY("open", path, flags) }
int open64(const char *path, int flags, ...) { OPEN_BODY("open64", path, flags) }
int openat(int dir, const char *path, int flags, ...) { OPEN_BODY("openat", dir, path, flags) }
int openat64(int dir, const char *path, int flags, ...) { OPEN_BODY("openat64", dir, path, flags) }

int mkdir(const char *path, mode_t m) {
    static int (*real)(const char *, mode_t);
    if (!real) real = dlsym(RTLD_NEXT, "mkdir");
    if (strcmp(mode(), "erofs") == 0 && matches_path(path)) { note("erofs", path); errno = EROFS; return -1; }
    return real(path, m);
}
