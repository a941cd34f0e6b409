/* A guest clock that ticks by calls, not by time, and an entropy source that repeats: preloaded into the counted
 * guest program (qemu -E LD_PRELOAD=...) so that no instruction count depends on when a run happened or on fresh
 * random bytes. Python and the libraries it loads read the clock thousands of times (CPython's time conversions
 * take value-dependent paths) and numpy seeds its global generator from os.urandom at import (big-integer
 * arithmetic whose length depends on the value): either made the counts of two identical runs differ by a few
 * thousand instructions.
 *
 * Every clock read advances the clock by one microsecond from a fixed start; random bytes come from a fixed-seed
 * xorshift generator. Built for the guest's architecture by tether/bench/insn_count.py. */
typedef long time_like;   /* time_t and suseconds_t/long of the guest's ABI (32-bit on armhf bookworm) */

struct guest_timespec {
    time_like tv_sec;
    long tv_nsec;
};
struct guest_timeval {
    time_like tv_sec;
    long tv_usec;
};

/* seconds and microseconds since a fixed start, kept apart: no 64-bit division (a libgcc call on armhf) */
static long sec = 1700000000L, usec;

static void tick(void)
{
    if (++usec == 1000000L) {
        usec = 0;
        sec++;
    }
}

__attribute__((visibility("default"))) int clock_gettime(int clock_id, struct guest_timespec *ts)
{
    (void)clock_id;
    tick();
    ts->tv_sec = sec;
    ts->tv_nsec = usec * 1000;
    return 0;
}

__attribute__((visibility("default"))) int gettimeofday(struct guest_timeval *tv, void *tz)
{
    (void)tz;
    tick();
    if (tv) {
        tv->tv_sec = sec;
        tv->tv_usec = usec;
    }
    return 0;
}

__attribute__((visibility("default"))) time_like time(time_like *out)
{
    tick();
    if (out) *out = sec;
    return sec;
}

static unsigned int xs = 0x9E3779B9u;

static unsigned char next_byte(void)
{
    xs ^= xs << 13;
    xs ^= xs >> 17;
    xs ^= xs << 5;
    return (unsigned char)(xs >> 24);
}

__attribute__((visibility("default"))) long getrandom(void *buf, unsigned long len, unsigned int flags)
{
    (void)flags;
    unsigned char *p = buf;
    for (unsigned long i = 0; i < len; i++) p[i] = next_byte();
    return (long)len;
}

__attribute__((visibility("default"))) int getentropy(void *buf, unsigned long len)
{
    getrandom(buf, len, 0);
    return 0;
}
