/* Non-blocking, type-checked opening of user-named files (files.h). */
#include "files.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *fsdp_file_type_name(mode_t mode) {
    if (S_ISREG(mode)) return "a regular file";
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    return "a special file";
}

static int not_regular(const char *path, const char *what, mode_t mode, fsdp_err *err) {
    return fsdp_errf(err, "%s%s%s is %s, not a regular file", what ? what : "", what ? " " : "", path,
                     fsdp_file_type_name(mode));
}

int fsdp_require_regular(const char *path, const char *what, fsdp_err *err) {
    struct stat st;
    if (stat(path, &st) != 0)
        return fsdp_errf(err, "%s%s%s: %s", what ? what : "", what ? " " : "", path, strerror(errno));
    return S_ISREG(st.st_mode) ? 0 : not_regular(path, what, st.st_mode, err);
}

int fsdp_regular_or_absent(const char *path, const char *what, fsdp_err *err) {
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno == ENOENT) return 0;
        return fsdp_errf(err, "%s%s%s: %s", what ? what : "", what ? " " : "", path, strerror(errno));
    }
    return S_ISREG(st.st_mode) ? 1 : not_regular(path, what, st.st_mode, err);
}

int fsdp_open_regular(const char *path, int flags, mode_t mode, const char *what, fsdp_err *err) {
    const char *sep = what ? " " : "";
    what = what ? what : "";
    struct stat st;
    /* A FIFO opened for writing without O_NONBLOCK waits for a reader; with it, fails with ENXIO:
     * look first so that the message says what the path is. */
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) return not_regular(path, what[0] ? what : NULL, st.st_mode, err);
    int fd = open(path, flags | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, mode);
    if (fd < 0) return fsdp_errf(err, "%s%s%s: %s", what, sep, path, strerror(errno));
    if (fstat(fd, &st) != 0) {
        fsdp_errf(err, "%s%s%s: %s", what, sep, path, strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        not_regular(path, what[0] ? what : NULL, st.st_mode, err);
        close(fd);
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        fsdp_errf(err, "%s%s%s: %s", what, sep, path, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

FILE *fsdp_fopen_regular(const char *path, const char *what, fsdp_err *err) {
    int fd = fsdp_open_regular(path, O_RDONLY, 0, what, err);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        fsdp_errf(err, "%s%s%s: fdopen: %s", what ? what : "", what ? " " : "", path, strerror(errno));
        close(fd);
    }
    return f;
}
