/* The n-gram index's short-n-gram comparison, branch-light C the probe loop inlines. */
#ifndef SPECFSM_NGRAM_PROBE_H
#define SPECFSM_NGRAM_PROBE_H

#include <stdint.h>

/* tok[e - d:e] == tok[L - d:L] for 1 <= d <= 4 (e, L >= d): the differences OR-ed
   together, one branch on the result instead of one per token. */
static inline int ngi_same_short(const int64_t *tok, int64_t e, int64_t L, int64_t d)
{
    uint64_t x = 0;
    switch (d) {
    case 4: x |= (uint64_t)(tok[e - 4] ^ tok[L - 4]); /* fall through */
    case 3: x |= (uint64_t)(tok[e - 3] ^ tok[L - 3]); /* fall through */
    case 2: x |= (uint64_t)(tok[e - 2] ^ tok[L - 2]); /* fall through */
    default: x |= (uint64_t)(tok[e - 1] ^ tok[L - 1]);
    }
    return x == 0;
}

#endif
