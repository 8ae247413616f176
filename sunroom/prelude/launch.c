/*
 * sunroom-launch: start a local kernel's first program as the kernel's own unprivileged user.
 *
 *   sunroom-launch UID GID GATE PROGRAM [ARG...]
 *
 * Run by a host that is root (sunroom/sandbox/process.py, LocalLaunch.spawn) in place of
 * `setpriv --reuid=UID --regid=GID --clear-groups -- [sh -c 'read -r _ && exec "$@"
 * </dev/null' --] PROGRAM ARG...`, one exec instead of two or three. In this order it:
 *
 *   1. drops every supplementary group, then sets the real, effective and saved group ids to
 *      GID, then the real, effective and saved user ids to UID, then clears every capability
 *      set, ambient included (leaving uid 0 does that, unless the host's securebits keep
 *      them), and checks that all of it holds; UID and GID must not be 0;
 *   2. with GATE 1, waits, as that user, for one line on its standard input (the host writes
 *      it once it has moved this process into the kernel's cgroup) and exits 1, running
 *      nothing, when the input ends first; standard input is then /dev/null;
 *   3. replaces itself with PROGRAM (an absolute path), keeping every other descriptor.
 *
 * Anything that fails is said in one line on standard error and the exit status is 127
 * (64 for a malformed command line); nothing is run then. Standard C and Linux system calls
 * only; built static beside the compiled watcher by sunroom/sandbox/watcher.py.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#define USAGE_EXIT 64
#define FAILED_EXIT 127

static int number(const char *text, long *out) {
    char *end;
    errno = 0;
    long value = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || value < 1 || value > 0x7ffffffe) return -1;
    *out = value;
    return 0;
}

static int fail(const char *what) {
    fprintf(stderr, "sunroom-launch: %s: %s\n", what, strerror(errno));
    return FAILED_EXIT;
}

static int refuse(const char *why) {
    fprintf(stderr, "sunroom-launch: %s\n", why);
    return FAILED_EXIT;
}

static int drop(uid_t uid, gid_t gid) {
    if (setgroups(0, NULL) != 0) return fail("cannot drop the supplementary groups");
    if (setresgid(gid, gid, gid) != 0) return fail("cannot set the kernel's group");
    if (setresuid(uid, uid, uid) != 0) return fail("cannot set the kernel's user");
    uid_t ru, eu, su;
    gid_t rg, eg, sg;
    if (getresuid(&ru, &eu, &su) != 0 || getresgid(&rg, &eg, &sg) != 0 ||
        ru != uid || eu != uid || su != uid || rg != gid || eg != gid || sg != gid ||
        getgroups(0, NULL) != 0) {
        return refuse("the kernel's user and group did not hold");
    }
    /* leaving uid 0 clears the capabilities, unless the host's securebits keep them (ambient
       ones then even survive the exec): clear every set here, then check that none is left */
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 && errno != EINVAL)
        return fail("cannot clear its ambient capabilities");
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct caps[_LINUX_CAPABILITY_U32S_3];
    memset(caps, 0, sizeof caps);
    if (syscall(SYS_capset, &header, caps) != 0) return fail("cannot drop its capabilities");
    if (syscall(SYS_capget, &header, caps) != 0) return fail("cannot read its capabilities");
    for (int i = 0; i < _LINUX_CAPABILITY_U32S_3; i++) {
        /* none permitted nor inheritable: no ambient one either (the kernel keeps ambient a
           subset of both) */
        if (caps[i].effective != 0 || caps[i].permitted != 0 || caps[i].inheritable != 0)
            return refuse("it still held capabilities after dropping them");
    }
    return 0;
}

static int pass_gate(void) {
    char c;
    for (;;) {
        ssize_t got = read(STDIN_FILENO, &c, 1);
        if (got == 1 && c == '\n') break;
        if (got == 1) continue;
        if (got < 0 && errno == EINTR) continue;
        return 1; /* the host let go before it opened the gate: run nothing */
    }
    int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null < 0) return fail("cannot open /dev/null");
    if (dup2(null, STDIN_FILENO) < 0) return fail("cannot make /dev/null its standard input");
    close(null);
    return 0;
}

int main(int argc, char **argv) {
    long uid, gid;
    if (argc < 5 || number(argv[1], &uid) || number(argv[2], &gid) ||
        (strcmp(argv[3], "0") != 0 && strcmp(argv[3], "1") != 0) || argv[4][0] != '/') {
        fputs("sunroom-launch: usage: sunroom-launch UID GID GATE /PROGRAM [ARG...] (UID and "
              "GID not 0, GATE 0 or 1; started by sunroom's host, never by hand)\n",
              stderr);
        return USAGE_EXIT;
    }
    int code = drop((uid_t)uid, (gid_t)gid);
    if (code != 0) return code;
    if (argv[3][0] == '1' && (code = pass_gate()) != 0) return code;
    execv(argv[4], argv + 4);
    return fail(argv[4]);
}
