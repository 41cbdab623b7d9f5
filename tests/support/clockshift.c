/* Steps the wall clock of one process on command: an LD_PRELOAD library for chaos tests.
 *
 * CLOCK_REALTIME (clock_gettime, gettimeofday, time) reads the real clock plus a shift in
 * milliseconds read from the file named by CLOCKSHIFT_FILE, looked at again every 20 ms, so
 * writing a new number there steps the process's clock the way an NTP step or a resumed
 * virtual machine does. Monotonic and boot-time clocks are left alone. The real clock is
 * read through the system call, never through dlsym or malloc: libfaketime's lookup recurses
 * inside jemalloc's start-up and cannot run redis-server.
 *
 * Built by tests/support/clockshift.py with the machine's C compiler.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long long shift_ns(void) {
    static const char *path;
    static int ready;
    static long long shift, next_look;
    struct timespec m;
    syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &m);
    long long now = m.tv_sec * 1000000000LL + m.tv_nsec;
    if (!ready) {
        path = getenv("CLOCKSHIFT_FILE");
        ready = 1;
    }
    if (path != NULL && now >= next_look) {
        int fd = open(path, O_RDONLY);
        if (fd >= 0) {
            char buf[32];
            ssize_t n = read(fd, buf, sizeof buf - 1);
            close(fd);
            if (n > 0) {
                buf[n] = 0;
                shift = strtoll(buf, NULL, 10) * 1000000LL;
            }
        }
        next_look = now + 20000000LL;
    }
    return shift;
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    int r = (int)syscall(SYS_clock_gettime, clock, ts);
    if (r == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) {
        long long t = ts->tv_sec * 1000000000LL + ts->tv_nsec + shift_ns();
        ts->tv_sec = t / 1000000000LL;
        ts->tv_nsec = t % 1000000000LL;
    }
    return r;
}

int gettimeofday(struct timeval *tv, void *tz) {
    (void)tz;
    struct timespec ts;
    int r = clock_gettime(CLOCK_REALTIME, &ts);
    if (r == 0 && tv != NULL) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return r;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out != NULL) *out = ts.tv_sec;
    return ts.tv_sec;
}
