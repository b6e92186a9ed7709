// clockshim shifts a process's wall clock: preloaded with LD_PRELOAD, it
// overrides clock_gettime for the realtime clocks, gettimeofday and time,
// and adds an offset in milliseconds read from the file named by
// CLOCKSHIM_FILE. The file is read again at most once a millisecond of the
// monotonic clock, so a test shifts the clock by rewriting it. The
// monotonic clocks are never shifted: they measure real time.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

typedef int (*gettime_fn)(clockid_t, struct timespec *);

static gettime_fn real_gettime;
static __thread int64_t offset_ms;
static __thread int64_t checked_ns = -1;

static int real(clockid_t id, struct timespec *ts) {
	if (!real_gettime) {
		real_gettime = (gettime_fn)dlsym(RTLD_NEXT, "clock_gettime");
	}
	return real_gettime(id, ts);
}

static int64_t offset(void) {
	struct timespec m;
	if (real(CLOCK_MONOTONIC, &m) != 0) {
		return offset_ms;
	}
	int64_t now = (int64_t)m.tv_sec * 1000000000 + m.tv_nsec;
	if (checked_ns >= 0 && now - checked_ns < 1000000) {
		return offset_ms;
	}
	checked_ns = now;
	const char *path = getenv("CLOCKSHIM_FILE");
	if (!path) {
		return offset_ms = 0;
	}
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		return offset_ms;
	}
	char buf[32];
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n > 0) {
		buf[n] = 0;
		offset_ms = strtoll(buf, NULL, 10);
	}
	return offset_ms;
}

static void shift(struct timespec *ts) {
	int64_t ns = (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec + offset() * 1000000;
	ts->tv_sec = ns / 1000000000;
	ts->tv_nsec = ns % 1000000000;
	if (ts->tv_nsec < 0) {
		ts->tv_nsec += 1000000000;
		ts->tv_sec--;
	}
}

int clock_gettime(clockid_t id, struct timespec *ts) {
	int r = real(id, ts);
	if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
		shift(ts);
	}
	return r;
}

int gettimeofday(struct timeval *tv, void *tz) {
	(void)tz;
	struct timespec ts;
	int r = clock_gettime(CLOCK_REALTIME, &ts);
	if (r == 0 && tv) {
		tv->tv_sec = ts.tv_sec;
		tv->tv_usec = ts.tv_nsec / 1000;
	}
	return r;
}

time_t time(time_t *t) {
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	if (t) {
		*t = ts.tv_sec;
	}
	return ts.tv_sec;
}
