// LD_PRELOAD shim for the chaos test: slows pread/pread64 without touching the product.
//   SLOW_PREAD_MS     delay per call in milliseconds (unset or 0: no delay)
//   SLOW_PREAD_MATCH  only fds whose path (/proc/self/fd/N) contains this; unset: every fd
// The path is looked up on every call rather than cached: fds are reused after close, and a
// readlink costs microseconds next to the delay.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef ssize_t (*pread_fn)(int, void*, size_t, off_t);
typedef ssize_t (*pread64_fn)(int, void*, size_t, off64_t);

static long delay_ms;
static const char* match;
static pread_fn real_pread;
static pread64_fn real_pread64;

__attribute__((constructor)) static void slow_pread_init(void) {
  const char* ms = getenv("SLOW_PREAD_MS");
  delay_ms = ms ? strtol(ms, NULL, 10) : 0;
  match = getenv("SLOW_PREAD_MATCH");
  real_pread = (pread_fn)dlsym(RTLD_NEXT, "pread");
  real_pread64 = (pread64_fn)dlsym(RTLD_NEXT, "pread64");
}

static void maybe_sleep(int fd) {
  if (delay_ms <= 0) return;
  if (match && *match) {
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    const ssize_t n = readlink(link, path, sizeof path - 1);
    if (n < 0) return;
    path[n] = '\0';
    if (!strstr(path, match)) return;
  }
  struct timespec ts = {delay_ms / 1000, (delay_ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

ssize_t pread(int fd, void* buf, size_t n, off_t off) {
  maybe_sleep(fd);
  return real_pread(fd, buf, n, off);
}

ssize_t pread64(int fd, void* buf, size_t n, off64_t off) {
  maybe_sleep(fd);
  return real_pread64(fd, buf, n, off);
}
