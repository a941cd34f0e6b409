/* Raw Linux syscalls for the freestanding test harnesses (no libc) that run tether modules under qemu-user:
   they read inputs from stdin, write results to stdout and exit, nothing else. */
#ifndef TETHER_TEST_FREESTANDING_IO_H
#define TETHER_TEST_FREESTANDING_IO_H

#if defined(__aarch64__)
enum { NR_READ = 63, NR_WRITE = 64, NR_EXIT = 93 };
static long sys3(long n, long a, long b, long c) {
  register long x8 __asm__("x8") = n; register long x0 __asm__("x0") = a;
  register long x1 __asm__("x1") = b; register long x2 __asm__("x2") = c;
  __asm__ volatile("svc #0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2) : "memory");
  return x0;
}
#elif defined(__arm__)
enum { NR_READ = 3, NR_WRITE = 4, NR_EXIT = 1 };
static long sys3(long n, long a, long b, long c) {
  register long r7 __asm__("r7") = n; register long r0 __asm__("r0") = a;
  register long r1 __asm__("r1") = b; register long r2 __asm__("r2") = c;
  __asm__ volatile("svc #0" : "+r"(r0) : "r"(r7), "r"(r1), "r"(r2) : "memory");
  return r0;
}
#else
#error "freestanding_io.h supports aarch64 and arm"
#endif

/* Read exactly `want` bytes from stdin; -1 on a short read. */
static int fill(char* p, long want) {
  while (want > 0) { long got = sys3(NR_READ, 0, (long)p, want); if (got <= 0) return -1; p += got; want -= got; }
  return 0;
}

#endif
