/*
 * crucible-audit.so: the dynamic linker's audit interface (rtld-audit(7), LD_AUDIT) for the
 * verifier's sandbox. In a process that holds CAP_DAC_OVERRIDE (the test command's shell,
 * the judge, anything test.sh starts before the tests run the agent's programs), no
 * agent-written shared object loads and no agent-written dynamic executable runs.
 *
 * Why: a red-team trial put a shared object in the end state and a config file that named
 * it; the test command's privileged shell loaded it before pytest started, read the session
 * keys and forged a passing session on every task. Protecting each config that can name a
 * library (nsswitch, gconv, openssl, pam, ...) is a list; this takes away what every such
 * route needs: the agent's native code inside a process with the verifier's rights.
 *
 * Agent-written (the same rule as crucible_guard): the file's change time lies in
 * [CRUCIBLE_PRISTINE_BEFORE, CRUCIBLE_AGENT_WRITTEN_UNTIL) (it arrived with the end state;
 * nothing can set a change time), or it changed after the first judge of the run took its
 * key (crucible_observer.JUDGE_MARK: from then on the tests run the agent's programs, which
 * as root may rewrite root-owned files) or after this process started. What the task image holds is older;
 * what test.sh installs before the process starts is newer and allowed.
 *
 * - la_version: in every process, before anything of the program runs. Decides once whether
 *   to enforce (privileged, and inside a verification: the verifier sets LD_AUDIT only for
 *   tasks that do not declare agent_code_in_judge = "allow" or children_privileged). An
 *   agent-written main executable there (test.sh runs the agent's program itself) runs
 *   without the capabilities the tests' children lose, as if the tests had started it
 *   (exit 126 when they cannot be dropped).
 * - la_objsearch: each candidate path (a name with a slash) for a library is refused (NULL:
 *   "not found") when it is agent-written, so the search goes on to the next directory,
 *   exactly as if it were absent.
 * - la_objopen: every object that loaded anyway (a path the search did not see) is checked
 *   again; an agent-written one ends the process at once (exit 126) before its constructors
 *   run.
 *
 * Freestanding: no libc (raw system calls), so it loads into any glibc of any version.
 * Processes without CAP_DAC_OVERRIDE (the programs the tests run, with their capabilities
 * dropped) are not touched: they load the agent's libraries as they should. musl ignores
 * LD_AUDIT: an image on musl has only the Python-level guard (docs/architecture.md).
 */
#define _GNU_SOURCE
#include <link.h>
#include <linux/capability.h>
#include <linux/stat.h>
#include <stdint.h>
#include <sys/syscall.h>

#if defined(__x86_64__)
static long sys6(long n, long a, long b, long c, long d, long e) {
    long ret;
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8)
                     : "rcx", "r11", "memory");
    return ret;
}
#elif defined(__aarch64__)
static long sys6(long n, long a, long b, long c, long d, long e) {
    register long x8 __asm__("x8") = n;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = d;
    register long x4 __asm__("x4") = e;
    __asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4) : "memory");
    return x0;
}
#else
#error "crucible-audit: only x86_64 and aarch64 are supported"
#endif

#define AT_FDCWD_ (-100)
#define O_RDONLY_CLOEXEC_ 02000000
#define STATX_CTIME_ 0x80U

enum { OFF = 0, ON = 1 };
static int enforce = OFF;
static int64_t window_start, window_end, process_start, judge_since;

static long str_len(const char *s) {
    long n = 0;
    while (s[n]) n++;
    return n;
}

static void say(const char *a, const char *b) {
    sys6(SYS_write, 2, (long)a, str_len(a), 0, 0);
    sys6(SYS_write, 2, (long)b, str_len(b), 0, 0);
    sys6(SYS_write, 2, (long)"\n", 1, 0, 0);
}

static int starts_with(const char *s, const char *prefix) {
    while (*prefix)
        if (*s++ != *prefix++) return 0;
    return 1;
}

static int64_t parse_ns(const char *s) {
    int64_t v = 0;
    if (!*s) return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > (INT64_MAX - 9) / 10) return -1;
        v = v * 10 + (*s - '0');
    }
    return v;
}

/* 1 when the process's effective set holds CAP_DAC_OVERRIDE. */
static int privileged(void) {
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2] = {{0, 0, 0}, {0, 0, 0}};
    if (sys6(SYS_capget, (long)&header, (long)data, 0, 0, 0) != 0) return 1; /* fail closed */
    return (data[0].effective >> CAP_DAC_OVERRIDE) & 1;
}

/* Drop what the judge's children lose (crucible_observer: CHOWN, DAC_OVERRIDE,
 * DAC_READ_SEARCH, FOWNER, SETGID, SETUID) from every set; no-new-privileges keeps an execve
 * from giving them back. 0 on success. */
static int drop_privileges(void) {
    const uint32_t bits = (1U << CAP_CHOWN) | (1U << CAP_DAC_OVERRIDE) |
                          (1U << CAP_DAC_READ_SEARCH) | (1U << CAP_FOWNER) |
                          (1U << CAP_SETGID) | (1U << CAP_SETUID);
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2] = {{0, 0, 0}, {0, 0, 0}};
    if (sys6(SYS_capget, (long)&header, (long)data, 0, 0, 0) != 0) return -1;
    data[0].effective &= ~bits;
    data[0].permitted &= ~bits;
    data[0].inheritable &= ~bits;
    header.pid = 0;
    if (sys6(SYS_capset, (long)&header, (long)data, 0, 0, 0) != 0) return -1;
    return privileged() ? -1 : 0;
}

/* 1 when ``path`` may hold the agent's bytes (see the top of this file). A path that cannot
 * be examined is not a file ld.so can map either. */
static int agent_written(const char *path) {
    struct statx st;
    if (!path || !*path || starts_with(path, "/opt/crucible/")) return 0;
    if (sys6(SYS_statx, AT_FDCWD_, (long)path, 0, STATX_CTIME_, (long)&st) != 0) return 0;
    int64_t ctime = (int64_t)st.stx_ctime.tv_sec * 1000000000 + st.stx_ctime.tv_nsec;
    if (ctime >= window_start && (window_end <= 0 || ctime < window_end)) return 1;
    if (judge_since > 0 && ctime >= judge_since) return 1;
    return process_start > 0 && ctime >= process_start;
}

/* When the first judge took its key (crucible_observer.JUDGE_MARK), or 0: a file of the
 * user nobody runs as, mode 0600, which only privileged processes can read. */
static int64_t read_judge_mark(void) {
    char buf[32];
    long fd = sys6(SYS_openat, AT_FDCWD_, (long)"/logs/.crucible-judge-since", O_RDONLY_CLOEXEC_,
                   0, 0);
    long n;
    if (fd < 0) return 0;
    n = sys6(SYS_read, fd, (long)buf, sizeof(buf) - 1, 0, 0);
    sys6(SYS_close, fd, 0, 0, 0, 0);
    if (n <= 0) return 0;
    buf[n] = 0;
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' ')) buf[--n] = 0;
    n = parse_ns(buf);
    return n > 0 ? n : 0;
}

/* Read the window from this process's initial environment (/proc/self/environ): what the
 * verifier gave the test command, inherited unchanged unless a trusted program changed it. */
static void read_window(void) {
    static char buf[1 << 16];
    long fd = sys6(SYS_openat, AT_FDCWD_, (long)"/proc/self/environ", O_RDONLY_CLOEXEC_, 0, 0);
    long n = 0, got;
    if (fd < 0) return;
    while (n < (long)sizeof(buf) - 1 &&
           (got = sys6(SYS_read, fd, (long)(buf + n), (long)sizeof(buf) - 1 - n, 0, 0)) > 0)
        n += got;
    sys6(SYS_close, fd, 0, 0, 0, 0);
    buf[n] = 0;
    window_start = window_end = -1;
    for (long i = 0; i < n; i += str_len(buf + i) + 1) {
        const char *kv = buf + i;
        if (starts_with(kv, "CRUCIBLE_PRISTINE_BEFORE="))
            window_start = parse_ns(kv + 25);
        else if (starts_with(kv, "CRUCIBLE_AGENT_WRITTEN_UNTIL="))
            window_end = parse_ns(kv + 29);
    }
    if (window_start > 0 && window_end >= 0) {
        enforce = ON;
        judge_since = read_judge_mark();
    }
}

unsigned int la_version(unsigned int version) {
    struct __kernel_timespec {
        int64_t tv_sec;
        long long tv_nsec;
    } now;
    static char exe[4096];
    if (version == 0) return 0;
    if (privileged()) read_window();
    if (enforce == ON) {
        if (sys6(SYS_clock_gettime, 0 /* CLOCK_REALTIME */, (long)&now, 0, 0, 0) == 0)
            process_start = now.tv_sec * 1000000000 + now.tv_nsec;
        long n = sys6(SYS_readlinkat, AT_FDCWD_, (long)"/proc/self/exe", (long)exe,
                      sizeof(exe) - 1, 0);
        if (n > 0) {
            exe[n] = 0;
            /* the executable changed before this process started: only the window counts */
            int64_t started = process_start;
            process_start = 0;
            if (agent_written(exe)) {
                /* the agent's program runs, as the tests' children do: without the rights
                 * that reach the tests, the keys or other users */
                if (drop_privileges() != 0) {
                    say("crucible: cannot drop the verifier's privileges for the agent-written "
                        "program ", exe);
                    sys6(SYS_exit_group, 126, 0, 0, 0, 0);
                }
                enforce = OFF;
                return 1;
            }
            process_start = started;
        }
    }
    return 1; /* LAV_CURRENT of the first interface: la_objsearch and la_objopen */
}

static int has_slash(const char *s) {
    for (; *s; s++)
        if (*s == '/') return 1;
    return 0;
}

char *la_objsearch(const char *name, uintptr_t *cookie, unsigned int flag) {
    (void)cookie;
    (void)flag;
    /* a bare name (LA_SER_ORIG "libc.so.6") is not a file: it would resolve against the
     * working directory, where an agent's file of that name must not hide the real one */
    if (enforce == ON && has_slash(name) && agent_written(name)) {
        say("crucible: refused an agent-written shared object in a privileged process: ", name);
        return 0;
    }
    return (char *)name;
}

unsigned int la_objopen(struct link_map *map, Lmid_t lmid, uintptr_t *cookie) {
    (void)lmid;
    (void)cookie;
    if (enforce == ON && map && map->l_name && map->l_name[0] && agent_written(map->l_name)) {
        say("crucible: an agent-written shared object was mapped in a privileged process; "
            "ending it: ", map->l_name);
        sys6(SYS_exit_group, 126, 0, 0, 0, 0);
    }
    return 0;
}
