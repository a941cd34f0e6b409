/* Raw Linux syscalls for the freestanding test harnesses (no libc) that run tether modules under qemu-user:
   they read inputs from stdin, write results to stdout and exit, nothing else. */
#ifndef TETHER_TEST_FREESTANDING_IO_H
#define TETHER_TEST_FREESTANDING_IO_H

/* Linux's syscall convention differs only in its numbers and registers: the number in x8/r7, arguments and
   result in x0../r0.. */
#if defined(__aarch64__)
enum { NR_READ = 63, NR_WRITE = 64, NR_EXIT = 93 };
#define SYS_REG_NR "x8"
#define SYS_REG_ARG(i) "x" #i
#elif defined(__arm__)
enum { NR_READ = 3, NR_WRITE = 4, NR_EXIT = 1 };
#define SYS_REG_NR "r7"
#define SYS_REG_ARG(i) "r" #i
#else
#error "freestanding_io.h supports aarch64 and arm"
#endif

static long sys3(long n, long a, long b, long c) {
  register long nr __asm__(SYS_REG_NR) = n; register long a0 __asm__(SYS_REG_ARG(0)) = a;
  register long a1 __asm__(SYS_REG_ARG(1)) = b; register long a2 __asm__(SYS_REG_ARG(2)) = c;
  __asm__ volatile("svc #0" : "+r"(a0) : "r"(nr), "r"(a1), "r"(a2) : "memory");
  return a0;
}

/* Read exactly `want` bytes from stdin; -1 on a short read. */
static int fill(char* p, long want) {
  while (want > 0) { long got = sys3(NR_READ, 0, (long)p, want); if (got <= 0) return -1; p += got; want -= got; }
  return 0;
}

#endif
