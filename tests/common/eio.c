/* A disk that answers EIO: loaded with LD_PRELOAD into `train` by tests/disk_faults.rs.
 *
 * Every write and sync to a file whose path contains $TRAINYARD_EIO_PATH fails with EIO, once
 * $TRAINYARD_EIO_AFTER (default 0) such calls (writes and syncs alike) have gone through: a sector that
 * stops answering partway through a run. The file's path is read from /proc/self/fd, so temporary copies
 * match by their name too. What Rust's std writes with on glibc: write, writev, pwrite64, fsync,
 * fdatasync (not copy_file_range or mmap: `train` writes its checkpoints, metrics and records with
 * write_all and sync_all).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

static long passed;

static int failing(int fd) {
    const char *pattern = getenv("TRAINYARD_EIO_PATH");
    if (pattern == NULL || *pattern == '\0' || fd < 0) return 0;
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) return 0;
    path[n] = '\0';
    if (strstr(path, pattern) == NULL) return 0;
    const char *after = getenv("TRAINYARD_EIO_AFTER");
    if (__atomic_fetch_add(&passed, 1, __ATOMIC_SEQ_CST) < (after ? atol(after) : 0)) return 0;
    errno = EIO;
    return 1;
}

#define REAL(name) static __typeof__(name) *real; if (!real) real = dlsym(RTLD_NEXT, #name)

ssize_t write(int fd, const void *buf, size_t count) {
    REAL(write);
    return failing(fd) ? -1 : real(fd, buf, count);
}

ssize_t writev(int fd, const struct iovec *iov, int iovcnt) {
    REAL(writev);
    return failing(fd) ? -1 : real(fd, iov, iovcnt);
}

ssize_t pwrite64(int fd, const void *buf, size_t count, off_t offset) {
    REAL(pwrite64);
    return failing(fd) ? -1 : real(fd, buf, count, offset);
}

int fsync(int fd) {
    REAL(fsync);
    return failing(fd) ? -1 : real(fd);
}

int fdatasync(int fd) {
    REAL(fdatasync);
    return failing(fd) ? -1 : real(fd);
}
