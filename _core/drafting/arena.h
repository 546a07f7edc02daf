/* The n-gram index's memory: an arena of 2 MiB chunks the kernel is asked to back with
   huge pages (Linux, madvise), carved into power-of-two blocks up to 1 MiB recycled
   through per-size free lists (never returned to the system); larger blocks get their
   own mapping. Not thread-safe: every caller holds the GIL, which serialises it. The
   free lists are static, so each module including this header has its own arena. */
#ifndef SPECFSM_ARENA_H
#define SPECFSM_ARENA_H

#include <stdlib.h>
#include <stdint.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif
#define NGI_CHUNK ((size_t)2 << 20)
#define NGI_MIN_CLASS 7
#define NGI_MAX_CLASS 20
static void *ngi_free_list[NGI_MAX_CLASS + 1];
static char *ngi_bump = NULL;
static size_t ngi_bump_left = 0;

static inline void *ngi_map(size_t n)
{
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    /* n is a multiple of NGI_CHUNK: map one chunk more, keep an aligned n */
    char *p = (char *)mmap(NULL, n + NGI_CHUNK, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == (char *)MAP_FAILED)
        return NULL;
    uintptr_t a = ((uintptr_t)p + NGI_CHUNK - 1) & ~(uintptr_t)(NGI_CHUNK - 1);
    size_t head = (size_t)(a - (uintptr_t)p);
    if (head)
        munmap(p, head);
    if (NGI_CHUNK - head)
        munmap((char *)a + n, NGI_CHUNK - head);
    madvise((void *)a, n, MADV_HUGEPAGE);
    return (void *)a;
#else
    return malloc(n);
#endif
}

static inline void ngi_unmap(void *p, size_t n)
{
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    munmap(p, n);
#else
    (void)n;
    free(p);
#endif
}

static inline void *ngi_table_alloc(size_t n)
{
    int k = NGI_MIN_CLASS;
    while (((size_t)1 << k) < n && k <= NGI_MAX_CLASS)
        k++;
    if (k > NGI_MAX_CLASS)
        return ngi_map((n + NGI_CHUNK - 1) & ~(NGI_CHUNK - 1));
    void *p = ngi_free_list[k];
    if (p) {
        ngi_free_list[k] = *(void **)p;
        return p;
    }
    size_t sz = (size_t)1 << k;
    if (ngi_bump_left < sz) {
        /* the rest of the old chunk goes to the free lists, largest blocks first */
        while (ngi_bump_left >= ((size_t)1 << NGI_MIN_CLASS)) {
            int j = NGI_MAX_CLASS;
            while (((size_t)1 << j) > ngi_bump_left)
                j--;
            *(void **)ngi_bump = ngi_free_list[j];
            ngi_free_list[j] = ngi_bump;
            ngi_bump += (size_t)1 << j;
            ngi_bump_left -= (size_t)1 << j;
        }
        char *c = (char *)ngi_map(NGI_CHUNK);
        if (c == NULL)
            return NULL;
        ngi_bump = c;
        ngi_bump_left = NGI_CHUNK;
    }
    p = ngi_bump;
    ngi_bump += sz;
    ngi_bump_left -= sz;
    return p;
}

static inline size_t ngi_round(size_t n)
{
    int k = NGI_MIN_CLASS;
    while (((size_t)1 << k) < n && k <= NGI_MAX_CLASS)
        k++;
    if (k > NGI_MAX_CLASS)
        return (n + NGI_CHUNK - 1) & ~(NGI_CHUNK - 1);
    return (size_t)1 << k;
}

static inline void ngi_table_free(void *p, size_t n)
{
    if (p == NULL)
        return;
    int k = NGI_MIN_CLASS;
    while (((size_t)1 << k) < n && k <= NGI_MAX_CLASS)
        k++;
    if (k > NGI_MAX_CLASS) {
        ngi_unmap(p, (n + NGI_CHUNK - 1) & ~(NGI_CHUNK - 1));
        return;
    }
    *(void **)p = ngi_free_list[k];
    ngi_free_list[k] = p;
}

#endif
