/* Cache prefetch hints for the drafting indexes' hot loops (a no-op where the compiler
   has no prefetch builtin). */
#ifndef SPECFSM_PREFETCH_H
#define SPECFSM_PREFETCH_H

#if defined(__GNUC__) || defined(__clang__)
#define NGI_PREFETCH(p) __builtin_prefetch((const void *)(p))
#define NGI_PREFETCH_W(p) __builtin_prefetch((const void *)(p), 1)
#else
#define NGI_PREFETCH(p) ((void)0)
#define NGI_PREFETCH_W(p) ((void)0)
#endif
/* A prefetch the compiler must keep: GCC treats __builtin_prefetch as free of side
   effects and deletes a loop that does nothing else (the token prefetch stage of
   extend_batch was compiled away). An asm volatile is never deleted. */
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
#define NGI_PREFETCH_KEEP(p) __asm__ __volatile__("prefetcht0 %0" : : "m"(*(const char *)(p)))
#elif (defined(__GNUC__) || defined(__clang__)) && defined(__aarch64__)
#define NGI_PREFETCH_KEEP(p) __asm__ __volatile__("prfm pldl1keep, %0" : : "Q"(*(const char *)(p)))
#elif defined(__GNUC__) || defined(__clang__)
#define NGI_PREFETCH_KEEP(p) do { __builtin_prefetch((const void *)(p)); \
    __asm__ __volatile__("" : : "r"((const void *)(p))); } while (0)
#else
#define NGI_PREFETCH_KEEP(p) ((void)0)
#endif

#endif
