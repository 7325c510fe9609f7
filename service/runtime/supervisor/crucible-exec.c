/*
 * crucible-exec: the exec supervisor that runs inside every Crucible sandbox.
 *
 * Statically linked, no dependency on anything in the image (no shell, no libc of the image,
 * no NSS). It lives on a read-only volume at /opt/crucible. A request reaches it in one of
 * two ways: `docker exec` starts it once per command (--request*), or over the channel its
 * idle instance opens at start-up (--idle --connect): for each request the idle process
 * forks a handler on a fresh socketpair and passes the other end to the control plane; the
 * handler takes the requested identity and serves the request exactly as a `docker exec`
 * would, without the engine's per-exec cost.
 *
 * Modes (argv[1]):
 *   --idle [--connect PATH] sleep forever (the container's main process under docker-init);
 *                           exits 0 on SIGTERM/SIGINT/SIGHUP. With --connect, first connect
 *                           once to the control plane's unix socket at PATH (a read-only
 *                           bind mount) and serve it: each byte 'N' is answered with one
 *                           byte and, by SCM_RIGHTS, a socket to a new handler, which reads
 *                           one request record and writes the frames back. No socket ever
 *                           listens in the sandbox.
 *   --version               print "crucible-exec <version>" and exit 0
 *   --request <base64>      run one request given as base64 of the request record
 *   --request-stdin         read one request record from stdin (for large requests)
 *
 * Request record (all integers big-endian):
 *   "CRX1" | u32 body_len | body
 *   body = field*, field = u8 tag | u32 len | len bytes
 *   tags: 'o' op (exec | resolve | mkdir | kill)     'a' argv element (repeatable)
 *         's' shell command (/bin/sh -c)               'c' cwd
 *         'e' env entry NAME=VALUE, raw bytes (repeatable; NAME alone unsets NAME)
 *         'i' stdin bytes                              't' timeout_ms (u64, 0 = none)
 *         'm' max_output_bytes per stream (u64)        'g' kill grace_ms (u64, default 500)
 *         'p' path (resolve, mkdir)                    'P' create parents (u8 0/1)
 *         'w' owner for mkdir: "name" or "uid[:gid]"   'k' process group to kill (u64)
 *         'u' identity (channel only; `docker exec` sets its own): "user[:group]", each a
 *             name or a number, as `docker exec -u` reads it: a named user takes its
 *             passwd uid, gid and home and its /etc/group memberships; a number not in
 *             passwd runs with gid 0; HOME comes from passwd unless an 'e' entry sets it
 *   Strings (argv, shell, cwd, env, path, owner) must not contain NUL bytes.
 *
 * Response: frames on stdout, each u8 type | u32 len | payload:
 *   'O' stdout bytes, 'E' stderr bytes (raw, never decoded; head chunks live as they are
 *       read, then the kept tail at the end; per stream the concatenation is what was kept)
 *   'S' started: "pid=N\n", the child's pid = its process group (for the kill op)
 *   'P' resolved path (resolve op)
 *   'R' result, ASCII "key=value\n" lines, always the last frame of a successful request:
 *       exec: exit_code, signal (0 = none), timed_out, oom_killed (1/0, -1 = unknown),
 *             pids_limit_hit (1/0, -1 = unknown), stdout_total, stderr_total,
 *             stdout_truncated, stderr_truncated, duration_ms
 *       resolve / mkdir / kill: ok=1
 *   'X' error "kind\nmessage" (kind: request, cwd, path, spawn, internal); last frame.
 *
 * Output cap: each stream keeps at most max_output_bytes: the first
 * head = max - max/2 bytes and the last tail = max/2 bytes; truncated = total > max.
 *
 * Exec semantics: the child runs in its own session (setsid, so its own process group) with
 * stdin from the given bytes or /dev/null. The call returns when the direct child exits:
 * whatever the pipes hold then is read, and if background processes still hold them a
 * detached drainer keeps reading (and discarding) so they never get SIGPIPE. A timeout sends
 * SIGTERM to the process group, then SIGKILL after grace_ms, and SIGKILL again until the
 * group is gone; the grace holds for the whole group even when the direct child (say the
 * /bin/sh of a string command) dies of the SIGTERM at once. exit_code is the status, or
 * 128+N for signal N. oom_killed compares the memory cgroup's oom_kill counter before and
 * after (cgroup v1 memory.oom_control, v2 memory.events); pids_limit_hit compares the pids
 * cgroup's "max" counter of pids.events (forks refused at the limit) the same way, and when
 * it moved the exec's process group is killed until gone, so a fork bomb the command left
 * in the background does not keep the sandbox's pids. Both counters are container-wide: a
 * concurrent exec's OOM kill or refused fork counts too.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef CRUCIBLE_EXEC_VERSION
#define CRUCIBLE_EXEC_VERSION "dev"
#endif

#define REQ_MAGIC "CRX1"
#define MAX_REQUEST_BYTES (256u << 20) /* refuse records above 256 MiB */
#define READ_CHUNK 65536
#define DEFAULT_GRACE_MS 500
#define DRAIN_BUDGET_MS 50    /* after the child exits, read what is there for at most this */
#define FORK_RETRY_MS 1000    /* retry fork on EAGAIN (pids limit) for at most this */
#define REAP_GROUP_MS 2000    /* after a timeout, SIGKILL the group until gone, at most this */

/* =========================================================================== utilities */

static uint64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static double now_ms_f(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1000.0 + (double)ts.tv_nsec / 1e6;
}

static void sleep_ms(unsigned ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        static const char msg[] = "crucible-exec: out of memory\n";
        (void)!write(2, msg, sizeof msg - 1);
        _exit(125);
    }
    return p;
}

static char *xstrndup(const unsigned char *p, size_t n) {
    char *s = xmalloc(n + 1);
    memcpy(s, p, n);
    s[n] = 0;
    return s;
}

static void set_nonblock(int fd) {
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* ============================================================ response framing (output) */

/* A sink for frames. A persistent agent would point this at a connection instead of fd 1. */
struct sink {
    int fd;
    int broken; /* a write failed: the reader is gone */
};

static int write_all(int fd, struct iovec *iov, int cnt) {
    while (cnt > 0) {
        ssize_t w = writev(fd, iov, cnt);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        while (cnt > 0 && (size_t)w >= iov->iov_len) {
            w -= (ssize_t)iov->iov_len;
            iov++;
            cnt--;
        }
        if (cnt > 0) {
            iov->iov_base = (char *)iov->iov_base + w;
            iov->iov_len -= (size_t)w;
        }
    }
    return 0;
}

static void emit(struct sink *s, char type, const void *data, size_t len) {
    unsigned char hdr[5];
    struct iovec iov[2];
    if (s->broken) return;
    hdr[0] = (unsigned char)type;
    hdr[1] = (unsigned char)(len >> 24);
    hdr[2] = (unsigned char)(len >> 16);
    hdr[3] = (unsigned char)(len >> 8);
    hdr[4] = (unsigned char)len;
    iov[0].iov_base = hdr;
    iov[0].iov_len = 5;
    iov[1].iov_base = (void *)data;
    iov[1].iov_len = len;
    if (write_all(s->fd, iov, len ? 2 : 1) < 0) s->broken = 1;
}

static void emit_error(struct sink *s, const char *kind, const char *fmt, ...) {
    char buf[4096];
    int n = snprintf(buf, sizeof buf, "%s\n", kind);
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < sizeof buf) vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    va_end(ap);
    emit(s, 'X', buf, strlen(buf));
}

/* ============================================================= request parsing (input) */

struct request {
    char op[16];
    char **argv; /* NULL-terminated; NULL when shell mode */
    size_t argc;
    char *shell;
    char *cwd;
    char **env;
    size_t envc;
    const unsigned char *stdin_data;
    size_t stdin_len;
    uint64_t timeout_ms;
    uint64_t max_output;
    uint64_t grace_ms;
    uint64_t pgid; /* kill op */
    char *path;
    int parents;
    char *owner;
    char *user; /* channel only */
    uint64_t observe; /* >0: fd 3 of the command is an observation pipe, capped at this */
};

static uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static uint64_t be64(const unsigned char *p) {
    return ((uint64_t)be32(p) << 32) | be32(p + 4);
}

static int has_nul(const unsigned char *p, size_t n) { return memchr(p, 0, n) != NULL; }

static void push(char ***vec, size_t *cnt, char *s) {
    char **v = realloc(*vec, (*cnt + 2) * sizeof **vec);
    if (!v) xmalloc((size_t)-1); /* reports and exits */
    v[(*cnt)++] = s;
    v[*cnt] = NULL;
    *vec = v;
}

/* Parse a record (magic + length + body). The request points into `buf` for stdin bytes.
 * Returns 0, or -1 with a message in err. */
static int parse_request(const unsigned char *buf, size_t len, struct request *rq, char *err,
                         size_t errlen) {
    memset(rq, 0, sizeof *rq);
    rq->max_output = 1u << 20;
    rq->grace_ms = DEFAULT_GRACE_MS;
    if (len < 8 || memcmp(buf, REQ_MAGIC, 4) != 0) {
        snprintf(err, errlen, "bad magic (not a CRX1 record)");
        return -1;
    }
    size_t body = be32(buf + 4);
    if (body != len - 8) {
        snprintf(err, errlen, "record length %zu does not match %zu bytes", body, len - 8);
        return -1;
    }
    const unsigned char *p = buf + 8, *end = buf + len;
    while (p < end) {
        if (end - p < 5) {
            snprintf(err, errlen, "truncated field header");
            return -1;
        }
        unsigned char tag = p[0];
        size_t n = be32(p + 1);
        p += 5;
        if ((size_t)(end - p) < n) {
            snprintf(err, errlen, "field '%c' overruns the record", tag);
            return -1;
        }
        int is_string = tag != 0 && strchr("ascepwu", tag) != NULL;
        if (is_string && has_nul(p, n)) {
            snprintf(err, errlen, "field '%c' contains a NUL byte", tag);
            return -1;
        }
        switch (tag) {
        case 'o':
            if (n >= sizeof rq->op) {
                snprintf(err, errlen, "op too long");
                return -1;
            }
            memcpy(rq->op, p, n);
            rq->op[n] = 0;
            break;
        case 'a': push(&rq->argv, &rq->argc, xstrndup(p, n)); break;
        case 's': rq->shell = xstrndup(p, n); break;
        case 'c': rq->cwd = xstrndup(p, n); break;
        case 'e': push(&rq->env, &rq->envc, xstrndup(p, n)); break;
        case 'i': rq->stdin_data = p; rq->stdin_len = n; break;
        case 'p': rq->path = xstrndup(p, n); break;
        case 'w': rq->owner = xstrndup(p, n); break;
        case 'u': rq->user = xstrndup(p, n); break;
        case 'P': rq->parents = n > 0 && p[0] != 0; break;
        case 't': case 'm': case 'g': case 'k': case 'C':
            if (n != 8) {
                snprintf(err, errlen, "field '%c' must be 8 bytes", tag);
                return -1;
            }
            if (tag == 't') rq->timeout_ms = be64(p);
            else if (tag == 'm') rq->max_output = be64(p);
            else if (tag == 'g') rq->grace_ms = be64(p);
            else if (tag == 'C') rq->observe = be64(p);
            else rq->pgid = be64(p);
            break;
        default:
            snprintf(err, errlen, "unknown field tag 0x%02x", tag);
            return -1;
        }
        p += n;
    }
    if (!rq->op[0]) strcpy(rq->op, "exec");
    if (strcmp(rq->op, "exec") == 0 && !rq->shell && rq->argc == 0) {
        snprintf(err, errlen, "exec needs a shell command or an argv");
        return -1;
    }
    if (strcmp(rq->op, "kill") == 0) {
        if (rq->pgid <= 1 || rq->pgid > INT_MAX) {
            snprintf(err, errlen, "kill needs a process group id > 1");
            return -1;
        }
    } else if (strcmp(rq->op, "exec") != 0 && !rq->path) {
        snprintf(err, errlen, "%s needs a path", rq->op);
        return -1;
    }
    return 0;
}

static int b64val(int c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
}

/* Decode standard or URL-safe base64 (padding optional). Returns length or -1. */
static long b64decode(const char *in, unsigned char *out) {
    long o = 0;
    unsigned acc = 0;
    int bits = 0;
    for (; *in && *in != '='; in++) {
        int v = b64val((unsigned char)*in);
        if (v < 0) return -1;
        acc = (acc << 6) | (unsigned)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (unsigned char)(acc >> bits);
        }
    }
    return o;
}

static int read_exact(int fd, unsigned char *buf, size_t n) {
    while (n > 0) {
        ssize_t r = read(fd, buf, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        buf += r;
        n -= (size_t)r;
    }
    return 0;
}

/* Read one record from fd. Returns a malloc'd buffer and its length, or NULL. */
static unsigned char *read_record(int fd, size_t *len, char *err, size_t errlen) {
    unsigned char hdr[8];
    if (read_exact(fd, hdr, 8) < 0) {
        snprintf(err, errlen, "could not read the record header from stdin");
        return NULL;
    }
    size_t body = be32(hdr + 4);
    if (body > MAX_REQUEST_BYTES) {
        snprintf(err, errlen, "record of %zu bytes is too large", body);
        return NULL;
    }
    unsigned char *buf = xmalloc(body + 8);
    memcpy(buf, hdr, 8);
    if (read_exact(fd, buf + 8, body) < 0) {
        snprintf(err, errlen, "record truncated: expected %zu body bytes", body);
        free(buf);
        return NULL;
    }
    *len = body + 8;
    return buf;
}

/* ===================================================================== output capture */

/* One captured stream: head bytes are emitted live, the rest goes through a tail ring. */
#define NCAPS 3 /* stdout, stderr, the observation pipe (fd 3 of the command; unused: fd -1) */

struct capture {
    char type; /* 'O', 'E' or 'C' */
    int fd;    /* read end of the child's pipe, -1 once closed */
    int eof;
    uint64_t total;
    uint64_t head_cap, head_sent;
    unsigned char *ring;
    uint64_t tail_cap, ring_pos, ring_fill;
};

static void capture_init(struct capture *c, char type, int fd, uint64_t max_output) {
    memset(c, 0, sizeof *c);
    c->type = type;
    c->fd = fd;
    c->tail_cap = max_output / 2;
    c->head_cap = max_output - c->tail_cap;
    c->ring = NULL; /* allocated when the head is full: most commands never need it */
}

static void capture_add(struct capture *c, struct sink *s, const unsigned char *d, size_t n) {
    c->total += n;
    uint64_t room = c->head_cap - c->head_sent;
    size_t take = n < room ? n : (size_t)room;
    if (take) {
        emit(s, c->type, d, take);
        c->head_sent += take;
        d += take;
        n -= take;
    }
    if (!c->tail_cap || !n) return;
    if (!c->ring) c->ring = xmalloc((size_t)c->tail_cap);
    if (n >= c->tail_cap) { /* only the last tail_cap bytes can survive */
        d += n - c->tail_cap;
        n = (size_t)c->tail_cap;
    }
    while (n > 0) {
        size_t k = (size_t)(c->tail_cap - c->ring_pos);
        if (k > n) k = n;
        memcpy(c->ring + c->ring_pos, d, k);
        c->ring_pos = (c->ring_pos + k) % c->tail_cap;
        c->ring_fill = c->ring_fill + k > c->tail_cap ? c->tail_cap : c->ring_fill + k;
        d += k;
        n -= k;
    }
}

static void capture_flush_tail(struct capture *c, struct sink *s) {
    if (!c->ring_fill) return;
    if (c->ring_fill < c->tail_cap) {
        emit(s, c->type, c->ring, (size_t)c->ring_fill);
        return;
    }
    emit(s, c->type, c->ring + c->ring_pos, (size_t)(c->tail_cap - c->ring_pos));
    if (c->ring_pos) emit(s, c->type, c->ring, (size_t)c->ring_pos);
}

static void capture_close(struct capture *c) {
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
}

/* Read once from the capture's fd. Returns 1 if data was read, 0 on EOF/EAGAIN. */
static int capture_read(struct capture *c, struct sink *s) {
    static unsigned char buf[READ_CHUNK];
    if (c->fd < 0 || c->eof) return 0;
    ssize_t r = read(c->fd, buf, sizeof buf);
    if (r > 0) {
        capture_add(c, s, buf, (size_t)r);
        return 1;
    }
    if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
        c->eof = 1;
        capture_close(c);
    }
    return 0;
}

/* ================================================================== process handling */

static int sigchld_pipe[2] = {-1, -1};

static void on_sigchld(int sig) {
    int e = errno;
    (void)sig;
    (void)!write(sigchld_pipe[1], "c", 1);
    errno = e;
}

static pid_t fork_retry(unsigned budget_ms) {
    uint64_t until = now_ms() + budget_ms;
    for (;;) {
        pid_t pid = fork();
        if (pid >= 0 || errno != EAGAIN || now_ms() >= until) return pid;
        sleep_ms(10);
    }
}

/* oom_kill counter of this memory cgroup, or -1 when not visible. */
static long long read_oom_kill(void) {
    static const char *files[] = {"/sys/fs/cgroup/memory/memory.oom_control",
                                  "/sys/fs/cgroup/memory.events"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        FILE *f = fopen(files[i], "re");
        if (!f) continue;
        char line[256];
        long long v = -1;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "oom_kill %lld", &v) == 1) break;
        fclose(f);
        if (v >= 0) return v;
    }
    return -1;
}

/* The "max" counter of this pids cgroup's pids.events (forks refused at pids.max), or -1
 * when not visible (cgroup v1 pids controller, v2 unified). */
static long long read_pids_max_events(void) {
    static const char *files[] = {"/sys/fs/cgroup/pids/pids.events", "/sys/fs/cgroup/pids.events"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        FILE *f = fopen(files[i], "re");
        if (!f) continue;
        char line[256];
        long long v = -1;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "max %lld", &v) == 1) break;
        fclose(f);
        if (v >= 0) return v;
    }
    return -1;
}

static void child_fail(const char *what, const char *arg, int code) {
    char buf[4400];
    int n = snprintf(buf, sizeof buf, "crucible-exec: %s%s%s: %s\n", what, arg ? " " : "",
                     arg ? arg : "", strerror(errno));
    if (n > 0) (void)!write(2, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
    _exit(code);
}

/* Refuse fallocate(2) with EOPNOTSUPP for the command and all it starts (a seccomp filter
 * is inherited and cannot be removed): preallocation takes disk without writing, faster
 * than any watcher can look, so the disk budget would not hold; glibc's posix_fallocate
 * then writes zeros instead, which the budget's watcher sees (service.runtime.diskwatch).
 * Needs no_new_privs (the container has it). Best effort: an unsupported kernel runs the
 * command without it. x86_64 with its i386 (fallocate 324) and x32 ABIs; other arches by
 * their own number. */
static void refuse_fallocate(void) {
#ifdef __NR_fallocate
    struct sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
#if defined(__x86_64__)
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_I386, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 324, 4, 5),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW), /* unreached */
#else
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
#endif
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_STMT(BPF_ALU | BPF_AND | BPF_K, 0xBFFFFFFFu), /* x32 numbers = x86_64's | 1<<30 */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_fallocate, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EOPNOTSUPP & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = (unsigned short)(sizeof code / sizeof *code), .filter = code};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0)
        (void)prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0);
#endif
}

/* In the forked child: become a session leader, wire stdio, apply cwd/env, exec. */
static void child_exec(const struct request *rq, int in_fd, int out_fd, int err_fd,
                       int report_fd, int obs_fd) {
    sigset_t none;
    sigemptyset(&none);
    for (int sig = 1; sig < NSIG; sig++) signal(sig, SIG_DFL);
    sigprocmask(SIG_SETMASK, &none, NULL);
    setsid();
    refuse_fallocate();
    if (in_fd < 0) in_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (dup2(in_fd, 0) < 0 || dup2(out_fd, 1) < 0 || dup2(err_fd, 2) < 0) _exit(125);
    if (obs_fd >= 0) { /* the observation pipe becomes fd 3, inherited (not close-on-exec) */
        if (report_fd == 3 && (report_fd = fcntl(3, F_DUPFD_CLOEXEC, 10)) < 0) _exit(125);
        if (obs_fd == 3) {
            if (fcntl(3, F_SETFD, 0) < 0) _exit(125);
        } else if (dup2(obs_fd, 3) < 0) {
            _exit(125);
        }
    }
    if (rq->cwd && chdir(rq->cwd) < 0) {
        int e = errno;
        (void)!write(report_fd, &e, sizeof e);
        _exit(126);
    }
    for (size_t i = 0; i < rq->envc; i++) {
        if (strchr(rq->env[i], '=')) putenv(rq->env[i]);
        else unsetenv(rq->env[i]);
    }
    if (rq->shell) {
        execl("/bin/sh", "sh", "-c", rq->shell, (char *)NULL);
        child_fail("exec", "/bin/sh", errno == ENOENT ? 127 : 126);
    }
    execvp(rq->argv[0], rq->argv);
    child_fail("exec", rq->argv[0], errno == ENOENT || errno == ENOTDIR ? 127 : 126);
}

/* Keep reading (and discarding) the pipes background processes still hold, detached. */
static void spawn_drainer(struct capture *caps, int ncaps) {
    pid_t pid = fork_retry(100);
    if (pid != 0) return; /* parent (or fork failed: the pipes just close) */
    setsid();
    prctl(PR_SET_NAME, "crucible-drain", 0, 0, 0);
    int devnull = open("/dev/null", O_RDWR);
    if (devnull >= 0) {
        dup2(devnull, 0);
        dup2(devnull, 1);
        dup2(devnull, 2);
    }
    for (int fd = 3; fd < 1024; fd++) {
        int keep = 0;
        for (int i = 0; i < ncaps; i++) keep |= caps[i].fd == fd;
        if (!keep) close(fd);
    }
    static unsigned char buf[READ_CHUNK];
    for (;;) {
        struct pollfd pf[2];
        int n = 0;
        for (int i = 0; i < ncaps; i++)
            if (caps[i].fd >= 0) pf[n++] = (struct pollfd){.fd = caps[i].fd, .events = POLLIN};
        if (n == 0) _exit(0);
        if (poll(pf, (nfds_t)n, -1) < 0 && errno != EINTR) _exit(0);
        for (int i = 0; i < n; i++) {
            if (!pf[i].revents) continue;
            ssize_t r = read(pf[i].fd, buf, sizeof buf);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
                for (int j = 0; j < ncaps; j++)
                    if (caps[j].fd == pf[i].fd) capture_close(&caps[j]);
        }
    }
}

/* True while the group has a member that is not a zombie (zombies still take signals, so
 * kill() alone cannot tell). Without /proc, any member counts. */
static int group_has_live_member(pid_t pgid) {
    if (kill(-pgid, 0) < 0) return 0;
    DIR *d = opendir("/proc");
    if (!d) return 1;
    int live = 0;
    struct dirent *e;
    while (!live && (e = readdir(d)) != NULL) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
        char path[300], buf[512];
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        ssize_t n = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (n <= 0) continue;
        buf[n] = 0;
        char *rp = strrchr(buf, ')'); /* comm may contain spaces and parentheses */
        char state;
        int ppid, pgrp;
        if (rp && sscanf(rp + 1, " %c %d %d", &state, &ppid, &pgrp) == 3)
            live = pgrp == pgid && state != 'Z' && state != 'X';
    }
    closedir(d);
    return live;
}

/* SIGKILL the process group until no live member is left (or the budget is spent). */
static void kill_group_until_gone(pid_t pgid) {
    uint64_t until = now_ms() + REAP_GROUP_MS;
    while (now_ms() < until) {
        kill(-pgid, SIGKILL);
        if (!group_has_live_member(pgid)) return;
        sleep_ms(5);
    }
}

/* Wait (reading the pipes, so writers do not block) until the group has no live member or
 * `until` (ms, monotonic) passes. */
static void await_group(pid_t pgid, uint64_t until, struct capture *caps, struct sink *s) {
    while (now_ms() < until && group_has_live_member(pgid)) {
        struct pollfd pf[NCAPS];
        int n = 0, idx[NCAPS];
        for (int i = 0; i < NCAPS; i++)
            if (caps[i].fd >= 0) {
                idx[n] = i;
                pf[n++] = (struct pollfd){.fd = caps[i].fd, .events = POLLIN};
            }
        if (n == 0) {
            sleep_ms(10);
            continue;
        }
        if (poll(pf, (nfds_t)n, 10) > 0)
            for (int k = 0; k < n; k++)
                if (pf[k].revents) capture_read(&caps[idx[k]], s);
    }
}

struct exec_state {
    pid_t pid;
    int status;
    int done;
    int timed_out;
    int phase; /* 0 running, 1 SIGTERM sent, 2 SIGKILL sent */
    uint64_t deadline, kill_at;
};

static void reap_child(struct exec_state *st) {
    char tmp[64];
    while (read(sigchld_pipe[0], tmp, sizeof tmp) > 0) {
    }
    if (!st->done && waitpid(st->pid, &st->status, WNOHANG) == st->pid) st->done = 1;
}

/* Escalate the timeout: SIGTERM the group at the deadline, SIGKILL after the grace. */
static void enforce_deadline(struct exec_state *st, const struct request *rq, int stop_now) {
    uint64_t t = now_ms();
    if (st->phase == 0 && (stop_now || (st->deadline && t >= st->deadline))) {
        st->timed_out = !stop_now;
        kill(-st->pid, SIGTERM);
        st->phase = 1;
        st->kill_at = t + rq->grace_ms;
    } else if (st->phase == 1 && t >= st->kill_at) {
        kill(-st->pid, SIGKILL);
        st->phase = 2;
    }
}

static int poll_timeout(const struct exec_state *st) {
    uint64_t t = now_ms(), until = 0;
    if (st->phase == 0 && st->deadline) until = st->deadline;
    if (st->phase == 1) until = st->kill_at;
    if (!until) return -1;
    return until <= t ? 0 : (int)(until - t > INT_MAX ? INT_MAX : until - t);
}

/* The main loop: feed stdin, capture output, watch the child and the deadline. */
static void exec_loop(struct exec_state *st, const struct request *rq, struct capture *caps,
                      int in_fd, struct sink *s) {
    size_t in_off = 0;
    while (!st->done) {
        struct pollfd pf[5];
        int n = 0, idx_in = -1, idx_cap[NCAPS] = {-1, -1, -1};
        pf[n++] = (struct pollfd){.fd = sigchld_pipe[0], .events = POLLIN};
        for (int i = 0; i < NCAPS; i++)
            if (caps[i].fd >= 0) {
                idx_cap[i] = n;
                pf[n++] = (struct pollfd){.fd = caps[i].fd, .events = POLLIN};
            }
        if (in_fd >= 0) {
            idx_in = n;
            pf[n++] = (struct pollfd){.fd = in_fd, .events = POLLOUT};
        }
        int r = poll(pf, (nfds_t)n, poll_timeout(st));
        if (r < 0 && errno != EINTR) { /* cannot happen with valid fds: wait it out */
            if (waitpid(st->pid, &st->status, 0) == st->pid) st->done = 1;
            break;
        }
        if (r > 0 && pf[0].revents) reap_child(st);
        for (int i = 0; i < NCAPS; i++)
            if (r > 0 && idx_cap[i] >= 0 && pf[idx_cap[i]].revents) capture_read(&caps[i], s);
        if (r > 0 && idx_in >= 0 && pf[idx_in].revents) {
            ssize_t w = write(in_fd, rq->stdin_data + in_off, rq->stdin_len - in_off);
            if (w > 0) in_off += (size_t)w;
            if ((w < 0 && errno != EAGAIN && errno != EINTR) || in_off >= rq->stdin_len ||
                (pf[idx_in].revents & (POLLERR | POLLHUP))) {
                close(in_fd);
                in_fd = -1;
            }
        }
        reap_child(st);
        enforce_deadline(st, rq, s->broken);
    }
    if (in_fd >= 0) close(in_fd);
}

/* After the direct child exited: read what is immediately there, for a bounded time. */
static void drain_now(struct capture *caps, struct sink *s) {
    uint64_t until = now_ms() + DRAIN_BUDGET_MS;
    for (int i = 0; i < NCAPS; i++)
        if (caps[i].fd >= 0) set_nonblock(caps[i].fd);
    int progress = 1;
    while (progress && now_ms() < until) {
        progress = 0;
        for (int i = 0; i < NCAPS; i++) progress |= capture_read(&caps[i], s);
    }
}

static void emit_exec_result(struct sink *s, const struct exec_state *st, struct capture *caps,
                             long long oom_before, int pids_hit, double t0) {
    long long oom_after = read_oom_kill();
    int oom = oom_before < 0 || oom_after < 0 ? -1 : oom_after > oom_before;
    int sig = WIFSIGNALED(st->status) ? WTERMSIG(st->status) : 0;
    int code = sig ? 128 + sig : WEXITSTATUS(st->status);
    uint64_t max0 = caps[0].head_cap + caps[0].tail_cap;
    uint64_t max1 = caps[1].head_cap + caps[1].tail_cap;
    char buf[512];
    uint64_t max2 = caps[2].head_cap + caps[2].tail_cap;
    for (int i = 0; i < NCAPS; i++) capture_flush_tail(&caps[i], s);
    int n = snprintf(buf, sizeof buf,
                     "exit_code=%d\nsignal=%d\ntimed_out=%d\noom_killed=%d\npids_limit_hit=%d\n"
                     "stdout_total=%llu\nstderr_total=%llu\n"
                     "stdout_truncated=%d\nstderr_truncated=%d\nduration_ms=%.3f\n"
                     "observed_total=%llu\nobserved_truncated=%d\n",
                     code, sig, st->timed_out, oom, pids_hit, (unsigned long long)caps[0].total,
                     (unsigned long long)caps[1].total, caps[0].total > max0,
                     caps[1].total > max1, now_ms_f() - t0, (unsigned long long)caps[2].total,
                     caps[2].total > max2);
    emit(s, 'R', buf, (size_t)n);
}

static int make_pipes(int out[2], int err[2], int in[2], int report[2], int obs[2], int want_in,
                      int want_obs) {
    in[0] = in[1] = obs[0] = obs[1] = -1;
    if (pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0 || pipe2(report, O_CLOEXEC) < 0)
        return -1;
    if (want_in && pipe2(in, O_CLOEXEC) < 0) return -1;
    if (want_obs && pipe2(obs, O_CLOEXEC) < 0) return -1;
    return 0;
}

/* Run an exec request to completion, emitting frames on s. */
static int run_exec(const struct request *rq, struct sink *s) {
    int out[2], err[2], in[2], report[2], obs[2];
    struct capture caps[NCAPS];
    struct exec_state st = {0};
    double t0 = now_ms_f();
    long long oom_before = read_oom_kill();
    long long pids_before = read_pids_max_events();

    if (make_pipes(out, err, in, report, obs, rq->stdin_len > 0, rq->observe > 0) < 0) {
        emit_error(s, "internal", "pipe: %s", strerror(errno));
        return 1;
    }
    st.pid = fork_retry(FORK_RETRY_MS);
    if (st.pid < 0) {
        emit_error(s, "spawn", "fork: %s", strerror(errno));
        return 1;
    }
    if (st.pid == 0) child_exec(rq, in[0], out[1], err[1], report[1], obs[1]);
    close(out[1]);
    close(err[1]);
    close(report[1]);
    if (obs[1] >= 0) close(obs[1]);
    if (in[0] >= 0) close(in[0]);

    int cwd_errno = 0;
    ssize_t rn;
    while ((rn = read(report[0], &cwd_errno, sizeof cwd_errno)) < 0 && errno == EINTR) {
    }
    close(report[0]);
    if (rn == (ssize_t)sizeof cwd_errno) {
        waitpid(st.pid, NULL, 0);
        if (obs[0] >= 0) close(obs[0]);
        emit_error(s, "cwd", "cwd %s: %s", rq->cwd, strerror(cwd_errno));
        return 1;
    }
    char started[32];
    int sn = snprintf(started, sizeof started, "pid=%d\n", (int)st.pid);
    emit(s, 'S', started, (size_t)sn);

    capture_init(&caps[0], 'O', out[0], rq->max_output);
    capture_init(&caps[1], 'E', err[0], rq->max_output);
    capture_init(&caps[2], 'C', obs[0], rq->observe ? rq->observe : 0);
    set_nonblock(out[0]);
    set_nonblock(err[0]);
    if (obs[0] >= 0) set_nonblock(obs[0]);
    if (in[1] >= 0) set_nonblock(in[1]);
    st.deadline = rq->timeout_ms ? now_ms() + rq->timeout_ms : 0;

    exec_loop(&st, rq, caps, in[1], s);
    /* The direct child may die of the SIGTERM at once (a /bin/sh wrapper): the rest of the
     * group still gets its grace before the SIGKILL. */
    if (st.phase == 1) await_group(st.pid, st.kill_at, caps, s);
    long long pids_after = read_pids_max_events();
    int pids_hit = pids_before < 0 || pids_after < 0 ? -1 : pids_after > pids_before;
    if (st.timed_out || s->broken || pids_hit == 1) kill_group_until_gone(st.pid);
    drain_now(caps, s);
    /* The observation pipe is never drained after the command: what is written later
     * (by a process the command left behind) is not the command's observation. */
    capture_close(&caps[2]);
    if (caps[0].fd >= 0 || caps[1].fd >= 0) spawn_drainer(caps, 2);
    for (int i = 0; i < 2; i++) capture_close(&caps[i]);
    emit_exec_result(s, &st, caps, oom_before, pids_hit, t0);
    return 0;
}

/* ====================================================================== path handling */

static int mkdir_p(const char *path, mode_t mode) {
    char buf[PATH_MAX];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(buf, path, n + 1);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, mode) < 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(buf, mode) < 0 && errno != EEXIST) return -1;
    struct stat sb;
    if (stat(buf, &sb) < 0) return -1;
    if (!S_ISDIR(sb.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

/* Append component `c` (len n) to the absolute path in out, handling "." and "..". */
static int path_push(char *out, const char *c, size_t n) {
    if (n == 0 || (n == 1 && c[0] == '.')) return 0;
    size_t len = strlen(out);
    if (n == 2 && c[0] == '.' && c[1] == '.') {
        char *slash = strrchr(out, '/');
        if (slash == out) out[1] = 0;
        else if (slash) *slash = 0;
        return 0;
    }
    if (len + 1 + n >= PATH_MAX) return -1;
    if (len > 1) out[len++] = '/';
    memcpy(out + len, c, n);
    out[len + n] = 0;
    return 0;
}

/* realpath(3) of the longest existing prefix, then the missing rest appended lexically
 * (like `realpath -m`). Returns 0, or -1 with errno. */
static int resolve_missing(const char *path, char *out) {
    char prefix[PATH_MAX];
    size_t n = strlen(path);
    if (n >= sizeof prefix) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(prefix, path, n + 1);
    for (;;) {
        if (realpath(prefix, out)) break;
        if (errno != ENOENT && errno != ENOTDIR) return -1;
        char *slash = strrchr(prefix, '/');
        if (!slash || slash == prefix) {
            strcpy(out, "/");
            prefix[0] = 0; /* nothing below the root exists: append all of `path` */
            break;
        }
        *slash = 0;
    }
    const char *rest = path + strlen(prefix);
    while (*rest) {
        while (*rest == '/') rest++;
        const char *e = strchrnul(rest, '/');
        if (path_push(out, rest, (size_t)(e - rest)) < 0) {
            errno = ENAMETOOLONG;
            return -1;
        }
        rest = e;
    }
    return 0;
}

static int run_resolve(const struct request *rq, struct sink *s) {
    char out[PATH_MAX];
    if (rq->path[0] != '/') {
        emit_error(s, "path", "path must be absolute: %s", rq->path);
        return 1;
    }
    if (resolve_missing(rq->path, out) < 0) {
        emit_error(s, "path", "%s: %s", rq->path, strerror(errno));
        return 1;
    }
    if (rq->parents && strcmp(out, "/") != 0) {
        char parent[PATH_MAX];
        strcpy(parent, out);
        char *slash = strrchr(parent, '/');
        if (slash == parent) slash[1] = 0;
        else *slash = 0;
        if (mkdir_p(parent, 0755) < 0) {
            emit_error(s, "path", "mkdir -p %s: %s", parent, strerror(errno));
            return 1;
        }
    }
    emit(s, 'P', out, strlen(out));
    emit(s, 'R', "ok=1\n", 5);
    return 0;
}

/* Look up "name", "uid" or "uid:gid" (name via /etc/passwd; no NSS in a static binary). */
static int lookup_owner(const char *owner, uid_t *uid, gid_t *gid) {
    char *end;
    unsigned long u = strtoul(owner, &end, 10);
    if (end != owner && (*end == 0 || *end == ':')) {
        *uid = (uid_t)u;
        *gid = *end == ':' ? (gid_t)strtoul(end + 1, NULL, 10) : (gid_t)u;
        return 0;
    }
    FILE *f = fopen("/etc/passwd", "re");
    if (!f) return -1;
    char line[1024];
    size_t nl = strlen(owner);
    int found = -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long pu, pg;
        if (strncmp(line, owner, nl) == 0 && line[nl] == ':' &&
            sscanf(line + nl, ":%*[^:]:%lu:%lu:", &pu, &pg) == 2) {
            *uid = (uid_t)pu;
            *gid = (gid_t)pg;
            found = 0;
            break;
        }
    }
    fclose(f);
    return found;
}

static int run_mkdir(const struct request *rq, struct sink *s) {
    uid_t uid = 0;
    gid_t gid = 0;
    if (rq->owner && lookup_owner(rq->owner, &uid, &gid) < 0) {
        emit_error(s, "path", "unknown user %s", rq->owner);
        return 1;
    }
    if (mkdir_p(rq->path, 0755) < 0) {
        emit_error(s, "path", "mkdir -p %s: %s", rq->path, strerror(errno));
        return 1;
    }
    if (rq->owner && chown(rq->path, uid, gid) < 0) {
        emit_error(s, "path", "chown %s: %s", rq->path, strerror(errno));
        return 1;
    }
    emit(s, 'R', "ok=1\n", 5);
    return 0;
}

/* Cancel an exec: SIGTERM its process group, SIGKILL after the grace, until it is gone. */
static int run_kill(const struct request *rq, struct sink *s) {
    pid_t pgid = (pid_t)rq->pgid;
    if (kill(-pgid, SIGTERM) == 0) {
        uint64_t until = now_ms() + rq->grace_ms;
        while (group_has_live_member(pgid) && now_ms() < until) sleep_ms(10);
        kill_group_until_gone(pgid);
    }
    emit(s, 'R', "ok=1\n", 5);
    return 0;
}

/* ========================================================================= identity */

/* One passwd entry by name, or by uid when name is NULL. Returns 0 when found. */
static int passwd_entry(const char *name, uid_t want, uid_t *uid, gid_t *gid, char *home,
                        size_t homelen, char *login, size_t loginlen) {
    FILE *f = fopen("/etc/passwd", "re");
    if (!f) return -1;
    char line[4096];
    int found = -1;
    while (found < 0 && fgets(line, sizeof line, f)) {
        char *fields[7] = {0};
        char *tok = line;
        int n = 0;
        /* strsep keeps empty fields (a password field may be empty) */
        while (n < 7 && (fields[n] = strsep(&tok, ":")) != NULL) n++;
        if (n < 7) continue;
        fields[6][strcspn(fields[6], "\n")] = 0;
        char *end;
        unsigned long pu = strtoul(fields[2], &end, 10);
        if (*end) continue;
        unsigned long pg = strtoul(fields[3], &end, 10);
        if (*end) continue;
        if (name ? strcmp(fields[0], name) != 0 : (uid_t)pu != want) continue;
        *uid = (uid_t)pu;
        *gid = (gid_t)pg;
        snprintf(home, homelen, "%s", fields[5]);
        snprintf(login, loginlen, "%s", fields[0]);
        found = 0;
    }
    fclose(f);
    return found;
}

/* A group's gid by name. Returns 0 when found. */
static int group_gid(const char *name, gid_t *gid) {
    FILE *f = fopen("/etc/group", "re");
    if (!f) return -1;
    char line[65536];
    int found = -1;
    size_t nl = strlen(name);
    while (found < 0 && fgets(line, sizeof line, f)) {
        unsigned long g;
        if (strncmp(line, name, nl) == 0 && line[nl] == ':' &&
            sscanf(line + nl, ":%*[^:]:%lu", &g) == 1) {
            *gid = (gid_t)g;
            found = 0;
        }
    }
    fclose(f);
    return found;
}

/* The gids of the groups that list `login` as a member, plus `primary`. */
static int member_gids(const char *login, gid_t primary, gid_t *out, int max) {
    int n = 0;
    out[n++] = primary;
    FILE *f = login[0] ? fopen("/etc/group", "re") : NULL;
    if (!f) return n;
    char line[65536];
    while (n < max && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *tok = line, *fields[4] = {0};
        int k = 0;
        while (k < 4 && (fields[k] = strsep(&tok, ":")) != NULL) k++;
        if (k < 4) continue;
        char *end;
        unsigned long g = strtoul(fields[2], &end, 10);
        if (*end) continue;
        for (char *m = strtok(fields[3], ","); m; m = strtok(NULL, ",")) {
            if (strcmp(m, login) == 0 && (gid_t)g != primary) {
                out[n++] = (gid_t)g;
                break;
            }
        }
    }
    fclose(f);
    return n;
}

static int has_env(const struct request *rq, const char *name) {
    size_t nl = strlen(name);
    for (size_t i = 0; i < rq->envc; i++)
        if (strncmp(rq->env[i], name, nl) == 0 && (rq->env[i][nl] == '=' || !rq->env[i][nl]))
            return 1;
    return 0;
}

/* Take the identity `docker exec -u user` would give (see the 'u' field). Returns 0, or -1
 * with a message in err. */
static int become(const struct request *rq, char *err, size_t errlen) {
    char spec[512], home[1024] = "/", login[256] = "";
    snprintf(spec, sizeof spec, "%s", rq->user && rq->user[0] ? rq->user : "0");
    char *group = strchr(spec, ':');
    if (group) *group++ = 0;
    uid_t uid = 0;
    gid_t gid = 0;
    char *end;
    unsigned long num = strtoul(spec, &end, 10);
    if (spec[0] && !*end) {
        uid = (uid_t)num;
        if (passwd_entry(NULL, uid, &uid, &gid, home, sizeof home, login, sizeof login) < 0) {
            gid = 0;
            login[0] = 0;
        }
    } else if (passwd_entry(spec, 0, &uid, &gid, home, sizeof home, login, sizeof login) < 0) {
        snprintf(err, errlen, "unable to find user %.200s: no matching entries in passwd file", spec);
        return -1;
    }
    if (group && group[0]) {
        unsigned long g = strtoul(group, &end, 10);
        if (!*end) gid = (gid_t)g;
        else if (group_gid(group, &gid) < 0) {
            snprintf(err, errlen, "unable to find group %.200s: no matching entries in group file",
                     group);
            return -1;
        }
    }
    gid_t groups[64];
    int ngroups = member_gids(group && group[0] ? "" : login, gid, groups, 64);
    if (!has_env(rq, "HOME")) setenv("HOME", home, 1);
    if (setgroups((size_t)ngroups, groups) < 0 || setgid(gid) < 0 || setuid(uid) < 0) {
        snprintf(err, errlen, "taking uid %u gid %u: %s", (unsigned)uid, (unsigned)gid,
                 strerror(errno));
        return -1;
    }
    return 0;
}

/* ========================================================================== channel */

static int dispatch(const struct request *rq, struct sink *s);
static void setup_signals(void);

/* In a forked handler: read one record from the connection, take its identity, serve it. */
static void serve_connection(int conn) {
    for (int sig = 1; sig < NSIG; sig++) signal(sig, SIG_DFL);
    struct sink s = {.fd = conn, .broken = 0};
    size_t len = 0;
    char err[512] = "";
    struct request rq;
    setup_signals();
    unsigned char *buf = read_record(conn, &len, err, sizeof err);
    if (!buf || parse_request(buf, len, &rq, err, sizeof err) < 0) {
        emit_error(&s, "request", "%s", err);
        _exit(2);
    }
    if (become(&rq, err, sizeof err) < 0) {
        emit_error(&s, "user", "%s", err);
        _exit(2);
    }
    _exit(dispatch(&rq, &s) & 0xff);
}

/* Send one byte and a file descriptor over a unix socket (SCM_RIGHTS). */
static int send_fd(int sock, int fd) {
    char byte = 'F';
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } u;
    memset(&u, 0, sizeof u);
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                         .msg_controllen = sizeof u.buf};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof(int));
    ssize_t n;
    while ((n = sendmsg(sock, &msg, MSG_NOSIGNAL)) < 0 && errno == EINTR) {
    }
    return n == 1 ? 0 : -1;
}

/* Connect to the control plane's socket at `path` (a read-only bind mount of a host
 * directory), once, at start-up: before anything of the agent's can run here. Returns the
 * connection, or -1 (then there is no channel; `docker exec` still works). */
static int connect_control(const char *path) {
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path) return -1;
    strcpy(addr.sun_path, path);
    for (int attempt = 0; attempt < 50; attempt++) {
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) return -1;
        if (connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0) return fd;
        close(fd);
        sleep_ms(20);
    }
    return -1;
}

/* Serve the control connection: for each 'N' byte, fork a handler on a fresh socketpair and
 * pass the other end back (SCM_RIGHTS). Nothing else can reach a handler: there is no
 * listening socket anywhere. Returns when the control plane goes away. */
static void serve_control(int control) {
    /* Not dumpable: the agent's processes (same uid, no CAP_SYS_PTRACE) cannot ptrace this
     * process, read its memory or take its descriptors (pidfd_getfd). */
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    for (;;) {
        char byte;
        ssize_t n = read(control, &byte, 1);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        if (byte != 'N') break;
        int pair[2];
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) < 0) break;
        pid_t pid = fork_retry(FORK_RETRY_MS); /* a fork bomb being reaped frees pids soon */
        if (pid == 0) {
            close(control);
            close(pair[0]);
            serve_connection(pair[1]);
        }
        close(pair[1]);
        int sent = pid > 0 ? send_fd(control, pair[0]) : -1;
        close(pair[0]);
        if (pid < 0) {
            char no = 'E';
            (void)!write(control, &no, 1); /* no handler: the control plane uses docker exec */
        } else if (sent < 0) {
            break;
        }
    }
    close(control);
}

/* ============================================================================ modes */

static void on_term(int sig) {
    (void)sig;
    _exit(0);
}

static void on_idle_sigchld(int sig) {
    int e = errno;
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    errno = e;
}

/* Sleep forever (serving the channel first, with `control`). Also reaps orphans and
 * handlers. */
static int run_idle(const char *control) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_idle_sigchld;
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigemptyset(&sa.sa_mask);
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    signal(SIGHUP, on_term);
    signal(SIGPIPE, SIG_IGN);
    sigaction(SIGCHLD, &sa, NULL);
    if (control) {
        int fd = connect_control(control);
        if (fd >= 0) serve_control(fd); /* returns when the control plane goes away */
    }
    for (;;) pause();
    return 0;
}

static int dispatch(const struct request *rq, struct sink *s) {
    if (strcmp(rq->op, "exec") == 0) return run_exec(rq, s);
    if (strcmp(rq->op, "resolve") == 0) return run_resolve(rq, s);
    if (strcmp(rq->op, "mkdir") == 0) return run_mkdir(rq, s);
    if (strcmp(rq->op, "kill") == 0) return run_kill(rq, s);
    emit_error(s, "request", "unknown op %s", rq->op);
    return 2;
}

static void setup_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigchld;
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigemptyset(&sa.sa_mask);
    if (pipe2(sigchld_pipe, O_CLOEXEC | O_NONBLOCK) < 0) _exit(125);
    sigaction(SIGCHLD, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

static int usage(void) {
    static const char msg[] =
        "usage: crucible-exec --idle [--connect PATH] | --version | --request <base64> | "
        "--request-stdin\n";
    (void)!write(2, msg, sizeof msg - 1);
    return 2;
}

int main(int argc, char **argv) {
    if (argc < 2) return usage();
    if (strcmp(argv[1], "--idle") == 0) {
        if (argc == 4 && strcmp(argv[2], "--connect") == 0) return run_idle(argv[3]);
        return argc == 2 ? run_idle(NULL) : usage();
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("crucible-exec %s\n", CRUCIBLE_EXEC_VERSION);
        return 0;
    }
    struct sink s = {.fd = 1, .broken = 0};
    unsigned char *buf = NULL;
    size_t len = 0;
    char err[512] = "";
    if (strcmp(argv[1], "--request") == 0 && argc == 3) {
        buf = xmalloc(strlen(argv[2]) * 3 / 4 + 4);
        long n = b64decode(argv[2], buf);
        if (n < 0) snprintf(err, sizeof err, "request is not valid base64");
        len = n < 0 ? 0 : (size_t)n;
    } else if (strcmp(argv[1], "--request-stdin") == 0) {
        buf = read_record(0, &len, err, sizeof err);
    } else {
        return usage();
    }
    struct request rq;
    setup_signals();
    if (err[0] || !buf || parse_request(buf, len, &rq, err, sizeof err) < 0) {
        emit_error(&s, "request", "%s", err);
        return 2;
    }
    return dispatch(&rq, &s);
}
