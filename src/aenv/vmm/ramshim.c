/* aenv-ram.so: preloaded into QEMU so that guest RAM is a private mapping of a file that
 * many VMs share (docs/architecture.md, "Guest memory").
 *
 * QEMU 7.2 skips a RAM block in migration (x-ignore-shared) only when it is `share=on`, and
 * a shared mapping gives every VM its own page cache. So QEMU is started with `share=on` and
 * this library turns that one file's mapping private: clean pages come from the page cache
 * of a file many VMs map (a template's, a snapshot's), pages the guest writes are its own
 * (copy on write), and the node writes those back to a new file itself (vmm/ram.py).
 *
 *  - open(AENV_RAM_FILE, O_RDWR) opens it read-only: the file is shared and immutable.
 *  - mmap(MAP_SHARED) of that fd maps it MAP_PRIVATE.
 *  - fallocate(PUNCH_HOLE) on it does nothing (a balloon discard must not punch the shared
 *    file; the madvise(DONTNEED) that follows drops the VM's own copy of the page).
 *  - on signal SIGRTMIN+4 the mapping is replaced, at the same address, by private
 *    mappings of the files named in AENV_RAM_CTL ("rebase": a base file, shared, and an
 *    overlay with the VM's written pages over their runs, so those stop being anonymous
 *    memory and the rest stays shared). The result goes to AENV_RAM_CTL.ack.
 *    The node sends it only while the guest's vCPUs are stopped.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef MAP_SHARED_VALIDATE
#define MAP_SHARED_VALIDATE 0x03
#endif
#ifndef MAP_SYNC
#define MAP_SYNC 0x80000
#endif

static const char *ram_file;
static const char *ram_ctl;
static int ram_fd = -1;
static void *ram_addr;
static size_t ram_len;

static int raw_open(const char *path, int flags, mode_t mode) {
    return (int)syscall(SYS_openat, AT_FDCWD, path, flags, mode);
}

static void *raw_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    return (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
}

static void ack(const char *msg) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s.ack", ram_ctl) >= (int)sizeof path) return;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = raw_open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return;
    ssize_t n = (ssize_t)strlen(msg);
    if (syscall(SYS_write, fd, msg, n) == n) syscall(SYS_rename, tmp, path);
    syscall(SYS_close, fd);
}

static int map_file(const char *path, size_t off, size_t len) {
    int fd = raw_open(path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) return -errno;
    void *at = (char *)ram_addr + off;
    void *p = raw_mmap(at, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED | MAP_NORESERVE,
                       fd, (off_t)off);
    int err = p == at ? 0 : -errno;
    syscall(SYS_close, fd);
    return err;
}

static size_t next_line(const char *buf, size_t n, size_t i, char *out, size_t cap) {
    size_t k = 0;
    while (i < n && buf[i] != '\n') {
        if (k + 1 < cap) out[k++] = buf[i];
        i++;
    }
    out[k] = 0;
    return i < n ? i + 1 : i;
}

/* The ctl file: the base file's path, then the overlay's path (or an empty line), then one
 * "offset length" line (decimal bytes) per run the overlay provides. The base is mapped over
 * the whole of guest RAM (an empty line: what is mapped stays), then the overlay over its
 * runs. */
static void rebase(int sig) {
    (void)sig;
    int saved = errno;
    char base[4096], overlay[4096], line[64], msg[64];
    if (ram_addr == NULL || ram_ctl == NULL) {
        ack("E no mapping\n");
        goto out;
    }
    int cfd = raw_open(ram_ctl, O_RDONLY | O_CLOEXEC, 0);
    if (cfd < 0) {
        ack("E no ctl\n");
        goto out;
    }
    off_t size = (off_t)syscall(SYS_lseek, cfd, 0, SEEK_END);
    const char *buf = size > 0 ? raw_mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, cfd, 0)
                               : MAP_FAILED;
    syscall(SYS_close, cfd);
    if (buf == MAP_FAILED) {
        ack("E empty ctl\n");
        goto out;
    }
    size_t n = (size_t)size, i = 0;
    i = next_line(buf, n, i, base, sizeof base);
    i = next_line(buf, n, i, overlay, sizeof overlay);
    int err = base[0] ? map_file(base, 0, ram_len) : 0;
    while (err == 0 && overlay[0] && i < n) {
        i = next_line(buf, n, i, line, sizeof line);
        char *end;
        unsigned long long off = strtoull(line, &end, 10);
        unsigned long long len = strtoull(end, NULL, 10);
        if (len == 0 || off + len > ram_len) continue;
        err = map_file(overlay, (size_t)off, (size_t)len);
    }
    syscall(SYS_munmap, buf, n);
    if (err != 0) {
        snprintf(msg, sizeof msg, "E map %d\n", -err);
        ack(msg);
        goto out;
    }
    ack("ok\n");
out:
    errno = saved;
}

__attribute__((constructor)) static void init(void) {
    ram_file = getenv("AENV_RAM_FILE");
    ram_ctl = getenv("AENV_RAM_CTL");
    if (ram_file == NULL) return;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = rebase;
    sa.sa_flags = SA_RESTART;
    sigfillset(&sa.sa_mask);
    sigaction(SIGRTMIN + 4, &sa, NULL);
}

static int is_ram(const char *path) {
    return ram_file != NULL && path != NULL && strcmp(path, ram_file) == 0;
}

static int fix_flags(const char *path, int flags) {
    if (is_ram(path) && (flags & O_ACCMODE) == O_RDWR) return (flags & ~O_ACCMODE) | O_RDONLY;
    return flags;
}

typedef int (*open_fn)(const char *, int, ...);
typedef int (*openat_fn)(int, const char *, int, ...);

#define OPEN_HOOK(name)                                                       \
    int name(const char *path, int flags, ...) {                              \
        static open_fn real;                                                  \
        if (!real) real = (open_fn)dlsym(RTLD_NEXT, #name);                   \
        mode_t mode = 0;                                                      \
        if (flags & (O_CREAT | O_TMPFILE)) {                                  \
            va_list ap;                                                       \
            va_start(ap, flags);                                              \
            mode = va_arg(ap, mode_t);                                        \
            va_end(ap);                                                       \
        }                                                                     \
        int fd = real(path, fix_flags(path, flags), mode);                    \
        if (fd >= 0 && is_ram(path)) ram_fd = fd;                             \
        return fd;                                                            \
    }

#define OPENAT_HOOK(name)                                                     \
    int name(int dirfd, const char *path, int flags, ...) {                   \
        static openat_fn real;                                                \
        if (!real) real = (openat_fn)dlsym(RTLD_NEXT, #name);                 \
        mode_t mode = 0;                                                      \
        if (flags & (O_CREAT | O_TMPFILE)) {                                  \
            va_list ap;                                                       \
            va_start(ap, flags);                                              \
            mode = va_arg(ap, mode_t);                                        \
            va_end(ap);                                                       \
        }                                                                     \
        int fd = real(dirfd, path, fix_flags(path, flags), mode);             \
        if (fd >= 0 && is_ram(path)) ram_fd = fd;                             \
        return fd;                                                            \
    }

OPEN_HOOK(open)
OPEN_HOOK(open64)
OPENAT_HOOK(openat)
OPENAT_HOOK(openat64)

/* _FORTIFY_SOURCE turns open(path, non-constant flags) into these (QEMU's file_ram_open). */
typedef int (*open2_fn)(const char *, int);

#define OPEN2_HOOK(name)                                                      \
    int name(const char *path, int flags) {                                   \
        static open2_fn real;                                                 \
        if (!real) real = (open2_fn)dlsym(RTLD_NEXT, #name);                  \
        int fd = real(path, fix_flags(path, flags));                          \
        if (fd >= 0 && is_ram(path)) ram_fd = fd;                             \
        return fd;                                                            \
    }

OPEN2_HOOK(__open_2)
OPEN2_HOOK(__open64_2)

typedef void *(*mmap_fn)(void *, size_t, int, int, int, off_t);

static void *map(mmap_fn real, void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    int type = flags & MAP_TYPE;
    int ours = fd >= 0 && fd == ram_fd && (type == MAP_SHARED || type == MAP_SHARED_VALIDATE);
    if (ours) flags = (flags & ~(MAP_TYPE | MAP_SYNC)) | MAP_PRIVATE;
    void *p = real(addr, len, prot, flags, fd, off);
    if (ours && p != MAP_FAILED && off == 0) {
        ram_addr = p;
        ram_len = len;
    }
    return p;
}

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    static mmap_fn real;
    if (!real) real = (mmap_fn)dlsym(RTLD_NEXT, "mmap");
    return map(real, addr, len, prot, flags, fd, off);
}

void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    static mmap_fn real;
    if (!real) real = (mmap_fn)dlsym(RTLD_NEXT, "mmap64");
    return map(real, addr, len, prot, flags, fd, off);
}

typedef int (*fallocate_fn)(int, int, off_t, off_t);

static int punch(fallocate_fn real, int fd, int mode, off_t off, off_t len) {
    if (fd >= 0 && fd == ram_fd && (mode & FALLOC_FL_PUNCH_HOLE)) return 0;
    return real(fd, mode, off, len);
}

int fallocate(int fd, int mode, off_t off, off_t len) {
    static fallocate_fn real;
    if (!real) real = (fallocate_fn)dlsym(RTLD_NEXT, "fallocate");
    return punch(real, fd, mode, off, len);
}

int fallocate64(int fd, int mode, off_t off, off_t len) {
    static fallocate_fn real;
    if (!real) real = (fallocate_fn)dlsym(RTLD_NEXT, "fallocate64");
    return punch(real, fd, mode, off, len);
}
