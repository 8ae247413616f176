/*
 * sunroom-watch: a kernel supervisor's watch loop, compiled.
 *
 * The contract is sunroom/prelude/watch.py's supervise(), which this program carries out
 * step for step; keep the two in step. The Python supervisor (sunroom/prelude/supervisor.py)
 * sets the kernel up, forks the runtime and then, when this program was built, replaces
 * itself with it (execv), so that each kernel's watcher is a process of a few pages instead
 * of a second Python interpreter (docs/design.md, "The watcher"). It keeps what the
 * supervisor set before the exec: it is a child subreaper, its parent-death signal, its
 * uid, namespaces and cgroup.
 *
 *   sunroom-watch KERNEL STATUS_FD REGISTRY_FD FORWARD_SIGINT READY_FD HANGUP_FD WORKDIR
 *
 * KERNEL is the runtime's pid (our child); STATUS_FD a pipe for the kernel's exit status
 * ("exit:N", "signal:N" or "terminated"), or -1, in which case the kernel's exit status
 * becomes ours (128 + signal for a signal); REGISTRY_FD the registry socket on which the
 * runtime names its copies (see watch.py), or -1; FORWARD_SIGINT 1 to relay SIGINT to the
 * kernel, else 0 (SIGINT is then ignored); READY_FD a descriptor closed once this process
 * may no longer be traced or read by the kernel's code (PR_SET_DUMPABLE 0): the runtime
 * waits for its end before it serves its first request; HANGUP_FD a copy's socket, or -1:
 * when the host hangs up on it the kernel is killed (it may be stuck in a cell); WORKDIR a
 * directory removed once everything has ended, or "" (a copy's workdir, where it is not the
 * copy's own tmpfs). SIGTERM, SIGINT and SIGCHLD arrive blocked (the supervisor blocks them
 * before the exec) and are read from a signalfd.
 *
 * Standard C and Linux system calls only; built static by sunroom/sandbox/watcher.py.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_OWNED 256       /* watch.py MAX_OWNED */
#define MESSAGE_BYTES 4096  /* one registry message, as watch.py reads it */
#define FDS_PER_MESSAGE 4   /* room for the descriptors one message may carry */
#define SWEEP_DEADLINE_S 10.0
#define USAGE_EXIT 64

/* -- a growable set of pids ------------------------------------------------------------- */

typedef struct {
    pid_t *items;
    size_t len, cap;
} Pids;

static void pids_add(Pids *set, pid_t pid) {
    if (set->len == set->cap) {
        size_t cap = set->cap ? set->cap * 2 : 16;
        pid_t *grown = realloc(set->items, cap * sizeof *grown);
        if (grown == NULL) {
            /* out of memory in a process of a few pages: end, rather than miss a descendant;
               the host sees the kernel end and empties its cgroup */
            fputs("sunroom-watch: out of memory\n", stderr);
            _exit(70);
        }
        set->items = grown;
        set->cap = cap;
    }
    set->items[set->len++] = pid;
}

static int pids_has(const Pids *set, pid_t pid) {
    for (size_t i = 0; i < set->len; i++)
        if (set->items[i] == pid) return 1;
    return 0;
}

static void pids_discard(Pids *set, pid_t pid) {
    for (size_t i = 0; i < set->len; i++)
        if (set->items[i] == pid) {
            set->items[i] = set->items[--set->len];
            return;
        }
}

static void pids_put(Pids *set, pid_t pid) {
    if (!pids_has(set, pid)) pids_add(set, pid);
}

/* -- /proc ------------------------------------------------------------------------------ */

/* The whole of a small file into buf (NUL-terminated); its length, or -1. */
static ssize_t read_small(const char *path, char *buf, size_t cap) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t got = 0;
    while (got + 1 < cap) {
        ssize_t n = read(fd, buf + got, cap - 1 - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got += (size_t)n;
    }
    close(fd);
    buf[got] = '\0';
    return (ssize_t)got;
}

/* The whole of a file into *buf, grown as needed (NUL-terminated); its length, or -1. */
static ssize_t read_whole(const char *path, char **buf, size_t *cap) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t got = 0;
    for (;;) {
        if (got + 1 >= *cap) {
            size_t grown_cap = *cap ? *cap * 2 : 4096;
            char *grown = realloc(*buf, grown_cap);
            if (grown == NULL) {
                close(fd);
                return -1;
            }
            *buf = grown;
            *cap = grown_cap;
        }
        ssize_t n = read(fd, *buf + got, *cap - 1 - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            close(fd);
            return -1;
        }
        if (n == 0) break;
        got += (size_t)n;
    }
    close(fd);
    (*buf)[got] = '\0';
    return (ssize_t)got;
}

/* The children of pid, of every thread of it, appended to out (none once it is gone). */
static void children(pid_t pid, Pids *out) {
    static char *buf;
    static size_t cap;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *dir = opendir(path);
    if (dir == NULL) return;
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
        char file[320];
        snprintf(file, sizeof file, "/proc/%d/task/%s/children", (int)pid, entry->d_name);
        if (read_whole(file, &buf, &cap) < 0) continue; /* never a partial list */
        char *cursor = buf;
        for (;;) {
            char *end;
            long kid = strtol(cursor, &end, 10);
            if (end == cursor) break;
            if (kid > 0) pids_add(out, (pid_t)kid);
            cursor = end;
        }
    }
    closedir(dir);
}

/* /proc/<pid>/cgroup into buf; 0, or -1 when it cannot be read ("None" in watch.py). */
static int cgroup_of(pid_t pid, char *buf, size_t cap) {
    char path[64];
    if (pid == 0)
        snprintf(path, sizeof path, "/proc/self/cgroup");
    else
        snprintf(path, sizeof path, "/proc/%d/cgroup", (int)pid);
    return read_small(path, buf, cap) < 0 ? -1 : 0;
}

/* Every live descendant of root except those in spare and theirs; with own_cgroup, also
   except the processes in a cgroup other than ours (watch.py descendants()). */
static void descendants(pid_t root, const Pids *spare, int own_cgroup, Pids *found) {
    static char mine[4096], theirs[4096];
    int have_mine = own_cgroup && cgroup_of(0, mine, sizeof mine) == 0;
    Pids stack = {0}, kids = {0};
    pids_add(&stack, root);
    while (stack.len > 0) {
        pid_t parent = stack.items[--stack.len];
        kids.len = 0;
        children(parent, &kids);
        for (size_t i = 0; i < kids.len; i++) {
            pid_t kid = kids.items[i];
            if (spare != NULL && pids_has(spare, kid)) continue;
            if (have_mine && cgroup_of(kid, theirs, sizeof theirs) == 0 &&
                strcmp(mine, theirs) != 0)
                continue;
            pids_add(found, kid);
            pids_add(&stack, kid);
        }
    }
    free(stack.items);
    free(kids.items);
}

static pid_t parent_of(pid_t pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    if (read_small(path, buf, sizeof buf) < 0) return -1;
    char *close_paren = strrchr(buf, ')');
    if (close_paren == NULL) return -1;
    char state;
    int ppid;
    if (sscanf(close_paren + 1, " %c %d", &state, &ppid) != 2) return -1;
    return (pid_t)ppid;
}

/* -- the watch -------------------------------------------------------------------------- */

typedef struct {
    pid_t pid;
    int status_fd, pidfd;
    char *workdir;
} Owned;

static pid_t kernel;
static int status_fd = -1, registry_fd = -1, forward_sigint = 0, signal_fd = -1, hangup_fd = -1;
static Pids copies;
static Owned owned[MAX_OWNED];
static size_t owned_len;
static char status[32]; /* "exit:N" or "signal:N" once the kernel has ended */
static int reported, exit_code, stop;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void status_word(int code, char *out, size_t cap) {
    if (WIFSIGNALED(code))
        snprintf(out, cap, "signal:%d", WTERMSIG(code));
    else
        snprintf(out, cap, "exit:%d", WIFEXITED(code) ? WEXITSTATUS(code) : 0);
}

static void report(int fd, const char *word) {
    if (fd < 0) return;
    ssize_t n;
    do n = write(fd, word, strlen(word));
    while (n < 0 && errno == EINTR);
    /* a host that stopped reading gets nothing: best effort, as in watch.py */
}

static int remove_entry(const char *path, const struct stat *st, int kind, struct FTW *ftw) {
    (void)st;
    (void)ftw;
    int failed = kind == FTW_DP ? rmdir(path) : unlink(path);
    /* best effort, and no further than the first refusal (as shutil.rmtree in watch.py):
       a workdir named by a forged message is not walked */
    return failed != 0 && errno != ENOENT ? 1 : 0;
}

static void remove_tree(const char *workdir) {
    if (workdir != NULL && workdir[0] != '\0')
        nftw(workdir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static Owned *owned_by_pid(pid_t pid) {
    for (size_t i = 0; i < owned_len; i++)
        if (owned[i].pid == pid) return &owned[i];
    return NULL;
}

/* An owned copy has ended: let go of its status pipe and pidfd, remove its workdir. */
static void gone(pid_t pid) {
    pids_discard(&copies, pid);
    Owned *copy = owned_by_pid(pid);
    if (copy == NULL) return;
    close(copy->status_fd);
    close(copy->pidfd);
    remove_tree(copy->workdir);
    free(copy->workdir);
    *copy = owned[--owned_len];
}

/* Note a child we reaped: the kernel's status, or an owned copy's. */
static void reaped(pid_t pid, int code) {
    pids_discard(&copies, pid);
    if (pid == kernel) {
        status_word(code, status, sizeof status);
        exit_code = WIFSIGNALED(code) ? 128 + WTERMSIG(code) : WEXITSTATUS(code);
        return;
    }
    Owned *copy = owned_by_pid(pid);
    if (copy != NULL) { /* re-parented here once the runtime that made it was gone */
        char word[32];
        status_word(code, word, sizeof word);
        report(copy->status_fd, word);
        gone(pid);
    }
}

static void reaped_copy(pid_t pid, int code) {
    if (pid != kernel) reaped(pid, code);
}

/* Stop, kill and reap every descendant until none is left or the deadline passes. */
static void sweep(const Pids *spare, int own_cgroup, void (*on_reaped)(pid_t, int)) {
    double end = now_s() + SWEEP_DEADLINE_S;
    Pids pids = {0};
    for (;;) {
        pids.len = 0;
        descendants(getpid(), spare, own_cgroup, &pids);
        for (size_t i = 0; i < pids.len; i++) kill(pids.items[i], SIGSTOP);
        for (size_t i = 0; i < pids.len; i++) kill(pids.items[i], SIGKILL);
        for (;;) {
            int code;
            pid_t pid = waitpid(-1, &code, WNOHANG);
            if (pid < 0 && errno == EINTR) continue;
            if (pid < 0) { /* ECHILD: nothing left to reap */
                free(pids.items);
                return;
            }
            if (pid == 0) break;
            on_reaped(pid, code);
        }
        if (pids.len == 0 || now_s() > end) break;
        struct timespec pause = {0, 1000000};
        nanosleep(&pause, NULL);
    }
    free(pids.items);
}

/* Take charge of an owned copy (watch.py _Watch.own): a copy is the child of the kernel
   or of another owned copy, or already re-parented here; a message naming any other
   process is dropped. */
static void own(pid_t pid, int copy_status_fd, const char *workdir) {
    pid_t parent = parent_of(pid);
    int related = parent < 0 || parent == kernel || parent == getpid() || owned_by_pid(parent);
    if (pid == kernel || pid == getpid() || !related) {
        close(copy_status_fd);
        return;
    }
    if (owned_len >= MAX_OWNED) {
        close(copy_status_fd);
        pids_put(&copies, pid);
        return;
    }
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pidfd < 0) { /* already gone and reaped by the runtime that made it */
        close(copy_status_fd);
        remove_tree(workdir);
        return;
    }
    char *kept = strdup(workdir);
    if (kept == NULL) {
        close(pidfd);
        close(copy_status_fd);
        pids_put(&copies, pid);
        return;
    }
    pids_put(&copies, pid);
    owned[owned_len++] = (Owned){pid, copy_status_fd, pidfd, kept};
}

/* Take in the registry's waiting messages; 0 once the socket is closed (or absent). */
static int drain_registry(void) {
    if (registry_fd < 0) return 0;
    for (;;) {
        char data[MESSAGE_BYTES + 1];
        char control[CMSG_SPACE(FDS_PER_MESSAGE * sizeof(int))];
        struct iovec iov = {data, MESSAGE_BYTES};
        struct msghdr msg = {0};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control;
        msg.msg_controllen = sizeof control;
        ssize_t n = recvmsg(registry_fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 1;
        int fds[FDS_PER_MESSAGE];
        size_t nfds = 0;
        if (n >= 0) {
            for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
                if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
                size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                for (size_t i = 0; i < count && nfds < FDS_PER_MESSAGE; i++)
                    memcpy(&fds[nfds++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            }
        }
        if (n <= 0) { /* the end (or an error, taken as the end) */
            for (size_t i = 0; i < nfds; i++) close(fds[i]);
            close(registry_fd);
            registry_fd = -1;
            return 0;
        }
        data[n] = '\0';
        char *tab = memchr(data, '\t', (size_t)n);
        const char *workdir = "";
        if (tab != NULL) {
            *tab = '\0';
            workdir = tab + 1;
        }
        char *head = data;
        while (*head == ' ' || *head == '\n' || *head == '\r' || *head == '\t') head++;
        char *end = head;
        while (*end >= '0' && *end <= '9') end++;
        char *rest = end;
        while (*rest == ' ' || *rest == '\n' || *rest == '\r' || *rest == '\t') rest++;
        long pid = (end > head && *rest == '\0' && end - head < 10) ? strtol(head, NULL, 10) : -1;
        if (pid <= 0) {
            for (size_t i = 0; i < nfds; i++) close(fds[i]);
        } else if (nfds > 0) {
            for (size_t i = 1; i < nfds; i++) close(fds[i]);
            own((pid_t)pid, fds[0], workdir);
        } else {
            pids_put(&copies, (pid_t)pid);
        }
    }
}

/* Reap every child that has ended: the kernel (its status noted), orphans, copies. */
static void reap(void) {
    for (;;) {
        int code;
        pid_t pid = waitpid(-1, &code, WNOHANG);
        if (pid < 0 && errno == EINTR) continue;
        if (pid <= 0) return;
        reaped(pid, code);
    }
}

/* After the kernel's end: kill all but the copies, report once; 1 when none is left. */
static int kernel_ended(void) {
    drain_registry(); /* every copy the kernel made is named before it ended */
    Pids alive = {0};
    descendants(getpid(), NULL, 0, &alive);
    for (size_t i = owned_len; i > 0; i--)
        if (!pids_has(&alive, owned[i - 1].pid)) gone(owned[i - 1].pid);
    for (size_t i = copies.len; i > 0; i--)
        if (!pids_has(&alive, copies.items[i - 1])) pids_discard(&copies, copies.items[i - 1]);
    free(alive.items);
    sweep(&copies, owned_len > 0, reaped);
    if (!reported && status[0] != '\0') { /* its processes are gone: say so now */
        report(status_fd, status);
        reported = 1;
    }
    return copies.len == 0;
}

static void on_signals(void) {
    struct signalfd_siginfo info;
    while (read(signal_fd, &info, sizeof info) == (ssize_t)sizeof info) {
        if (info.ssi_signo == SIGTERM)
            stop = 1;
        else if (info.ssi_signo == SIGINT && forward_sigint)
            kill(kernel, SIGINT);
        /* SIGCHLD: the next turn reaps */
    }
}

/* Wait (at most a second) for a signal, a registry message, the host's hangup or an owned
   copy's end. */
static void wait_once(void) {
    struct pollfd fds[3 + MAX_OWNED];
    nfds_t n = 0;
    fds[n++] = (struct pollfd){signal_fd, POLLIN, 0};
    nfds_t registry_at = registry_fd >= 0 ? n : 0;
    if (registry_fd >= 0) fds[n++] = (struct pollfd){registry_fd, POLLIN, 0};
    nfds_t hangup_at = hangup_fd >= 0 ? n : 0;
    if (hangup_fd >= 0) fds[n++] = (struct pollfd){hangup_fd, 0, 0}; /* POLLHUP, POLLERR */
    nfds_t first_copy = n;
    for (size_t i = 0; i < owned_len; i++) fds[n++] = (struct pollfd){owned[i].pidfd, POLLIN, 0};
    if (poll(fds, n, 1000) <= 0) return;
    if (fds[0].revents) on_signals();
    if (registry_at && fds[registry_at].revents) drain_registry();
    if (hangup_at && fds[hangup_at].revents) { /* the host closed the copy or died: end it */
        close(hangup_fd);
        hangup_fd = -1;
        if (status[0] == '\0') kill(kernel, SIGKILL);
    }
    for (nfds_t i = first_copy; i < n; i++) {
        if (!fds[i].revents) continue;
        reap(); /* an owned copy ended; if it is our child, reap() has it */
        for (size_t j = 0; j < owned_len; j++)
            if (owned[j].pidfd == fds[i].fd) {
                if (parent_of(owned[j].pid) != getpid())
                    gone(owned[j].pid); /* the runtime that made it reaps it and reports */
                break;
            }
    }
}

static int number(const char *text, long low, long *out) {
    char *end;
    errno = 0;
    long value = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || value < low || value > 0x7fffffff)
        return -1;
    *out = value;
    return 0;
}

int main(int argc, char **argv) {
    long args[6];
    if (argc != 8 || number(argv[1], 1, &args[0]) || number(argv[2], -1, &args[1]) ||
        number(argv[3], -1, &args[2]) || number(argv[4], 0, &args[3]) ||
        number(argv[5], -1, &args[4]) || number(argv[6], -1, &args[5]) ||
        (argv[7][0] != '\0' && argv[7][0] != '/')) {
        fputs("sunroom-watch: usage: sunroom-watch KERNEL STATUS_FD REGISTRY_FD FORWARD_SIGINT "
              "READY_FD HANGUP_FD WORKDIR (started by a kernel's supervisor, never by hand)\n",
              stderr);
        return USAGE_EXIT;
    }
    kernel = (pid_t)args[0];
    status_fd = (int)args[1];
    registry_fd = (int)args[2];
    forward_sigint = args[3] != 0;
    hangup_fd = (int)args[5];
    const char *workdir = argv[7];
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0); /* the exec made us traceable again: not for long */
    if (args[4] >= 0) close((int)args[4]); /* now the runtime may serve requests */
    prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); /* kept across the exec; said again */
    signal(SIGPIPE, SIG_IGN);
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGCHLD);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    signal_fd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    if (signal_fd < 0) {
        perror("sunroom-watch: signalfd");
        kill(kernel, SIGKILL); /* nobody could watch it: end it rather than leave it */
        return 70;
    }
    on_signals(); /* what arrived while the supervisor became us */
    while (!stop) {
        reap();
        if (status[0] != '\0' && kernel_ended()) break;
        wait_once();
    }
    sweep(NULL, 0, reaped_copy); /* a kernel killed here was "terminated" */
    while (owned_len > 0) gone(owned[owned_len - 1].pid);
    if (status[0] == '\0') report(status_fd, "terminated");
    remove_tree(workdir); /* a copy's workdir, after its status (as the Python supervisor) */
    return status_fd >= 0 ? 0 : exit_code;
}
