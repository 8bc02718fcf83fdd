/*
 * aenv-exec: the last steps before a user process runs, as a static binary.
 *
 * The agent is a large Python process. Forking it (needed for a preexec_fn or setuid
 * in the child) costs 50-70 ms under TCG; vfork of the agent plus an exec of this
 * static helper costs about 10 ms. So the agent vforks this helper, which joins the
 * cgroup, sets the OOM score and nice value, takes the controlling terminal, drops to
 * the user and execs the command, in that order (the order of spawn.py's preexec_fn).
 *
 *   aenv-exec -e FD [-c CGROUP_PROCS] [-o OOM_SCORE_ADJ] [-n NICE] [-t]
 *             [-u UID -g GID [-G G1,G2,...]] -- PROGRAM ARGS...
 *
 * FD is the write end of a pipe, close-on-exec here: EOF without data tells the agent
 * that PROGRAM was executed; on failure the helper writes "<step>:<errno>" and exits 127.
 * PROGRAM is looked up in PATH as CPython's subprocess does: no /bin/sh fallback for
 * ENOEXEC, and the first error other than ENOENT/ENOTDIR wins.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <unistd.h>

static int report_fd = -1;

static void fail(const char *step, int err)
{
    char buf[64];
    int n = snprintf(buf, sizeof buf, "%s:%d", step, err);
    if (report_fd >= 0 && n > 0)
        (void)!write(report_fd, buf, (size_t)n);
    _exit(127);
}

static void write_file(const char *path, const char *value)
{
    /* Best effort, as in the Python path: a missing cgroup must not stop a command. */
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    (void)!write(fd, value, strlen(value));
    close(fd);
}

static long number(const char *s, const char *step)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *s == '\0' || *end != '\0')
        fail(step, EINVAL);
    return v;
}

static int parse_groups(char *csv, gid_t *out, int max)
{
    int n = 0;
    for (char *tok = strtok(csv, ","); tok; tok = strtok(NULL, ",")) {
        if (n == max)
            fail("groups", E2BIG);
        out[n++] = (gid_t)number(tok, "groups");
    }
    return n;
}

extern char **environ;

static void exec_in_path(char **argv)
{
    const char *prog = argv[0];
    if (strchr(prog, '/')) {
        execve(prog, argv, environ);
        fail("exec", errno);
    }
    const char *path = getenv("PATH");
    if (!path)
        path = "/bin:/usr/bin"; /* os.defpath */
    int saved = 0;
    char buf[4096];
    for (const char *p = path;; p++) {
        const char *end = strchrnul(p, ':');
        int n = end == p ? snprintf(buf, sizeof buf, "%s", prog)
                         : snprintf(buf, sizeof buf, "%.*s/%s", (int)(end - p), p, prog);
        if (n > 0 && (size_t)n < sizeof buf) {
            execve(buf, argv, environ);
            if (errno != ENOENT && errno != ENOTDIR && saved == 0)
                saved = errno;
        }
        if (*end == '\0')
            break;
        p = end;
    }
    fail("exec", saved ? saved : ENOENT);
}

int main(int argc, char **argv)
{
    const char *cgroup = NULL, *oom = NULL;
    char *groups_csv = NULL;
    long nice_value = 0, uid = -1, gid = -1;
    int set_nice = 0, ctty = 0, opt;

    while ((opt = getopt(argc, argv, "+e:c:o:n:tu:g:G:")) != -1) {
        switch (opt) {
        case 'e': report_fd = (int)number(optarg, "usage"); break;
        case 'c': cgroup = optarg; break;
        case 'o': oom = optarg; break;
        case 'n': nice_value = number(optarg, "usage"); set_nice = 1; break;
        case 't': ctty = 1; break;
        case 'u': uid = number(optarg, "usage"); break;
        case 'g': gid = number(optarg, "usage"); break;
        case 'G': groups_csv = optarg; break;
        default: fail("usage", EINVAL);
        }
    }
    if (optind >= argc || (uid < 0) != (gid < 0))
        fail("usage", EINVAL);
    if (report_fd >= 0 && fcntl(report_fd, F_SETFD, FD_CLOEXEC) < 0)
        fail("usage", errno);

    if (cgroup)
        write_file(cgroup, "0");
    if (oom)
        write_file("/proc/self/oom_score_adj", oom);
    if (set_nice && setpriority(PRIO_PROCESS, 0, (int)nice_value) < 0)
        fail("nice", errno);
    if (ctty && ioctl(0, TIOCSCTTY, 0) < 0)
        fail("ctty", errno);
    if (uid >= 0) {
        gid_t groups[256];
        int n = groups_csv ? parse_groups(groups_csv, groups, 256) : 0;
        if (setgroups((size_t)n, groups) < 0)
            fail("setgroups", errno);
        if (setresgid((gid_t)gid, (gid_t)gid, (gid_t)gid) < 0)
            fail("setgid", errno);
        if (setresuid((uid_t)uid, (uid_t)uid, (uid_t)uid) < 0)
            fail("setuid", errno);
    }
    exec_in_path(&argv[optind]);
    return 127;
}
