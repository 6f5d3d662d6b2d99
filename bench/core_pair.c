/* What moving data between two CPUs costs right now: the measurement behind "slow stretches" on
 * a VM, whose host may give its virtual CPUs two hyperthreads of one core (cheap transfers) or
 * cores far apart (a cache line's round trip 5x slower, a MiB handed over 10x slower), and may
 * switch between the two within a minute. Shared-memory collectives follow that cost; loops on
 * one CPU do not.
 *
 *   cc -O2 -pthread bench/core_pair.c -o core_pair && ./core_pair [CPU_A CPU_B]   (default 0 1)
 *
 * Prints one JSON line, the best of 3 runs of each:
 *   rtt_ns      a cache line's round trip: two threads, pinned to the two CPUs, bump a shared
 *               counter in turn, 100,000 times;
 *   handoff_ms  64 x 1 MiB written on CPU_A and copied out on CPU_B, a MiB at a time;
 *   local_ms    the same 64 x 1 MiB written and copied out on CPU_A alone.
 * Exit status 2 when a CPU cannot be pinned (say, fewer than two allowed). */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MIB (1 << 20)
#define STEPS 64
#define ROUND_TRIPS 100000L

static _Alignas(64) atomic_long turn;
static unsigned char *shared[2], *own;
static int cpu[2] = {0, 1};
static volatile unsigned sink;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int pin(int which)
{
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu[which], &s);
    return pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static void relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void wait_turn(long value)
{
    while (atomic_load_explicit(&turn, memory_order_acquire) != value)
        relax();
}

static void *bounce(void *arg)
{
    long me = (long)arg;
    if (pin((int)me) != 0) exit(2);
    for (long i = me; i < 2 * ROUND_TRIPS; i += 2) {
        wait_turn(i);
        atomic_store_explicit(&turn, i + 1, memory_order_release);
    }
    return NULL;
}

static void *hand_over(void *arg)
{
    long me = (long)arg;
    if (pin((int)me) != 0) exit(2);
    for (long s = 0; s < STEPS; s++) {
        wait_turn(2 * s + me);
        if (me == 0) memset(shared[s & 1], (int)s, MIB);        /* written here ... */
        else memcpy(own, shared[s & 1], MIB), sink += own[s];  /* ... read over there */
        atomic_store_explicit(&turn, 2 * s + me + 1, memory_order_release);
    }
    return NULL;
}

static double pair(void *(*fn)(void *))
{
    pthread_t t[2];
    atomic_store(&turn, 0);
    double start = now();
    for (long i = 0; i < 2; i++) pthread_create(&t[i], NULL, fn, (void *)i);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    return now() - start;
}

static double alone(void)
{
    if (pin(0) != 0) exit(2);
    double start = now();
    for (long s = 0; s < STEPS; s++) {
        memset(shared[s & 1], (int)s, MIB);
        memcpy(own, shared[s & 1], MIB);
        sink += own[s];
    }
    return now() - start;
}

int main(int argc, char **argv)
{
    if (argc == 3) cpu[0] = atoi(argv[1]), cpu[1] = atoi(argv[2]);
    for (int i = 0; i < 2; i++) shared[i] = aligned_alloc(4096, MIB), memset(shared[i], 0, MIB);
    own = aligned_alloc(4096, MIB);
    memset(own, 0, MIB);
    double rtt = 1e9, handoff = 1e9, local = 1e9;
    for (int r = 0; r < 3; r++) {
        double t = pair(bounce) / ROUND_TRIPS;
        if (t < rtt) rtt = t;
        if ((t = pair(hand_over)) < handoff) handoff = t;
        if ((t = alone()) < local) local = t;
    }
    printf("{\"cpus\": [%d, %d], \"rtt_ns\": %.0f, \"handoff_ms\": %.1f, \"local_ms\": %.1f}\n",
           cpu[0], cpu[1], rtt * 1e9, handoff * 1e3, local * 1e3);
    return 0;
}
