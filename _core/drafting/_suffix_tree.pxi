# Tree drafts from the suffix index (compiled): ``SuffixIndex.propose_tree``.
#
# The rule is the twin's, exactly (specfsm/drafting/_suffix_tree_py.py's docstring):
# contexts from the match's suffix-link chain, the latest TREE_OCC earlier occurrences
# of each found by one backward scan of the history, then best-first over the trie of
# their continuations by the estimate of the regime the chain's agreement picks
# (copying: the mixed shares, the chain first; free: counts discounted by depth), ties
# by the preferred occurrence. Bounded
# work: at most TREE_CTX * TREE_OCC occurrences, each in at most one candidate at a time;
# the scan reads the history back from the end until the longest context has TREE_OCC
# occurrences or TREE_WINDOW positions are read (the chain, from the automaton, may
# start anywhere). Included from suffix_index.pyx.

cdef enum:
    TREE_OCC = 32          # = _tree_checks.TREE_OCCURRENCES
    TREE_CTX = 3           # = _tree_checks.TREE_CONTEXTS
    TREE_SLOTS = 97        # TREE_OCC * TREE_CTX + 1 (the chain): occurrences (and live candidates) at most
    CHAIN_BIT = 1 << 3     # an occurrence's mask: the chain's start
    TREE_NODES = 1024      # = _tree_checks.MAX_TREE_NODES
    TREE_WIDTH = 4         # = _tree_checks.DEFAULT_TREE_WIDTH
    TREE_WINDOW = 2048     # = _tree_checks.TREE_WINDOW: occurrences end at most this far back
    INSERTION_MAX = 16     # _tree_group sorts this many occurrences or fewer by insertion
    AGREE_SPAN = 32        # = _tree_checks.TREE_AGREE_SPAN
    AGREE_MIN = 24         # = _tree_checks.TREE_AGREE_MIN

from specfsm.drafting._tree_checks import (
    DEFAULT_TREE_WIDTH, MAX_TREE_NODES, TREE_AGREE_MIN, TREE_AGREE_SPAN, TREE_CONTEXTS,
    TREE_OCCURRENCES, TREE_WINDOW as _WINDOW)
if (MAX_TREE_NODES, TREE_OCCURRENCES, TREE_CONTEXTS, DEFAULT_TREE_WIDTH, _WINDOW, TREE_AGREE_SPAN,
        TREE_AGREE_MIN) != (TREE_NODES, TREE_OCC, TREE_CTX, TREE_WIDTH, TREE_WINDOW, AGREE_SPAN, AGREE_MIN):
    raise ImportError("_suffix_tree.pxi's limits differ from specfsm.drafting._tree_checks'")

cdef double[3] TREE_W = [1.0, 0.25, 0.0625]   # the twin's WEIGHTS
cdef double CHAIN_W = 4.0                      # the twin's CHAIN_WEIGHT
cdef double TREE_DECAY[TREE_NODES]             # the twin's DEPTH_DECAY: 0.9 ** k by repeated products
cdef int _decay_i
TREE_DECAY[0] = 1.0
for _decay_i in range(1, TREE_NODES):
    TREE_DECAY[_decay_i] = TREE_DECAY[_decay_i - 1] * 0.9


ctypedef struct tcand_t:
    double p               # the estimate
    int64_t rep            # the preferred occurrence's end (the tie-break)
    int64_t tok
    int32_t parent         # tree index of the parent, -1: the root
    int32_t depth          # this node's depth (the root's children: 1)
    int32_t lo, hi         # its occurrences: ix[lo:hi]


ctypedef struct tree_t:
    const sam_t* m
    int64_t L, depth, chain
    int k
    bint earliest
    bint copying           # the regime: the chain agrees with the recent history
    int64_t ctx[TREE_CTX]
    int64_t cnt[TREE_CTX]
    int64_t occ_e[TREE_SLOTS]
    uint8_t occ_m[TREE_SLOTS]   # bit i: counted for context i
    int32_t ix[TREE_SLOTS]
    int64_t key_a[TREE_SLOTS]   # _tree_group's work space
    int64_t key_b[TREE_SLOTS]
    int32_t ix_a[TREE_SLOTS]
    int32_t ix_b[TREE_SLOTS]
    tcand_t cand[TREE_SLOTS]
    int64_t ncand


cdef int _tree_contexts(tree_t* t) noexcept nogil:
    """The context lengths, longest first: the match, then up to two suffix links."""
    cdef const sam_t* m = t.m
    cdef int32_t s
    cdef int64_t lo = m.min_n if m.min_n > 1 else 1
    cdef int i
    t.k = 0
    if m.match_end < 0:
        return 0
    t.ctx[0] = m.match_len
    t.k = 1
    s = m.cursor
    for i in range(2):
        s = _link(m, s)
        if s <= 0 or _len(m, s) < lo:
            break
        t.ctx[t.k] = _len(m, s)
        t.k += 1
    return t.k


from _scan cimport find_last, find_last_pair


ctypedef fused tok_t:
    int32_t
    int64_t


cdef int64_t _tree_scan_h(tree_t* t, const tok_t* h) noexcept nogil:
    """The scan over the history ``h``: returns the occurrences written."""
    cdef int64_t L = t.L, n0 = t.ctx[0], e, ml, nocc = 0, need, stop
    cdef tok_t last = h[L - 1]
    cdef int i, mask, open_ = t.k - 1     # the shortest context still counting
    need = t.ctx[open_]
    stop = L - TREE_WINDOW if L > TREE_WINDOW else 0
    e = L - 1
    while e > stop:
        # the next end back that follows the last token, or the last two while every
        # context still counting is 2 tokens or more (the ends passed would count for
        # none): scan.h's vectorised search, where testing the ends one by one was most
        # of a tree's cost
        if need >= 2:
            e = find_last_pair(h, stop if stop > 1 else 1, e - 1, h[L - 2], last) + 1
        else:
            e = find_last(h, stop, e - 1, last) + 1
        if e <= stop:
            break
        # an end counts only if its match reaches the shortest context still counting
        if e < need or h[e - need] != h[L - need]:
            e -= 1
            continue
        ml = 1
        while ml < n0 and ml < e and h[e - 1 - ml] == h[L - 1 - ml]:
            ml += 1
        mask = 0
        for i in range(t.k):
            if ml >= t.ctx[i] and t.cnt[i] < TREE_OCC:
                mask |= 1 << i
                t.cnt[i] += 1
        if mask:
            t.occ_e[nocc] = e
            t.occ_m[nocc] = <uint8_t>mask
            t.ix[nocc] = <int32_t>nocc
            nocc += 1
        if t.cnt[0] >= TREE_OCC:
            break
        while t.cnt[open_] >= TREE_OCC:
            open_ -= 1
        need = t.ctx[open_]
        e -= 1
    return nocc


cdef void _tree_scan(tree_t* t) noexcept nogil:
    """The counted occurrences: ends e from L - 1 down to L - TREE_WINDOW + 1, the
    latest TREE_OCC per context, then the chain's start."""
    cdef const sam_t* m = t.m
    cdef int64_t nocc = 0, j
    cdef int i
    for i in range(TREE_CTX):
        t.cnt[i] = 0
    if t.k and t.L >= 2:
        if m.wide:
            nocc = _tree_scan_h(t, <const int64_t*>m.t64)
        else:
            nocc = _tree_scan_h(t, <const int32_t*>m.t32)
    if t.chain >= 0:
        for j in range(nocc):
            if t.occ_e[j] == t.chain:
                t.occ_m[j] |= CHAIN_BIT
                break
        else:
            t.occ_e[nocc] = t.chain
            t.occ_m[nocc] = CHAIN_BIT
            t.ix[nocc] = <int32_t>nocc
            nocc += 1
    t.ncand = nocc   # (the occurrences, until _tree_spawn of the root reads them)


cdef void _tree_group(tree_t* t, int64_t d, int32_t lo, int32_t hi) noexcept nogil:
    """Sort ix[lo:hi] by the token at depth d of each occurrence (an insertion sort up to
    INSERTION_MAX of them, else a bottom-up merge sort of (token, occurrence) pairs; the
    order within a token does not matter: a group's estimate and preferred occurrence
    are its members' counts and extreme end, and no two candidates tie)."""
    cdef int64_t n = hi - lo, w, i, a, b, am, bm, o
    cdef int64_t* src = t.key_a
    cdef int64_t* dst = t.key_b
    cdef int32_t* isrc = t.ix_a
    cdef int32_t* idst = t.ix_b
    cdef int64_t* ks
    cdef int32_t* ts
    cdef int64_t key
    cdef int32_t occ
    if n < 2:
        if n == 1:
            t.key_a[0] = _tk(t.m, t.occ_e[t.ix[lo]] + d)
        return
    if n <= INSERTION_MAX:
        # a node deep in the tree has a few occurrences: insertion sort in place
        for i in range(n):
            occ = t.ix[lo + i]
            key = _tk(t.m, t.occ_e[occ] + d)
            a = i
            while a > 0 and src[a - 1] > key:
                src[a] = src[a - 1]
                t.ix[lo + a] = t.ix[lo + a - 1]
                a -= 1
            src[a] = key
            t.ix[lo + a] = occ
        return
    for i in range(n):
        isrc[i] = t.ix[lo + i]
        src[i] = _tk(t.m, t.occ_e[isrc[i]] + d)
    w = 1
    while w < n:
        i = 0
        while i < n:
            a = i
            am = i + w if i + w < n else n
            b = am
            bm = i + 2 * w if i + 2 * w < n else n
            o = i
            while a < am and b < bm:
                if src[b] < src[a]:
                    dst[o] = src[b]
                    idst[o] = isrc[b]
                    b += 1
                else:
                    dst[o] = src[a]
                    idst[o] = isrc[a]
                    a += 1
                o += 1
            while a < am:
                dst[o] = src[a]
                idst[o] = isrc[a]
                a += 1
                o += 1
            while b < bm:
                dst[o] = src[b]
                idst[o] = isrc[b]
                b += 1
                o += 1
            i += 2 * w
        ks = src
        src = dst
        dst = ks
        ts = isrc
        isrc = idst
        idst = ts
        w *= 2
    for i in range(n):
        t.ix[lo + i] = isrc[i]
        t.key_a[i] = src[i]          # the spawn reads the tokens from here


cdef inline bint _better(const tree_t* t, const tcand_t* a, const tcand_t* b) noexcept nogil:
    """Candidate a goes before b: larger estimate, then the preferred occurrence."""
    if a.p != b.p:
        return a.p > b.p
    return (a.rep < b.rep) if t.earliest else (a.rep > b.rep)


cdef inline void _heap_up(tree_t* t, int64_t i) noexcept nogil:
    """The candidates are a binary heap, the best first: sift entry i up."""
    cdef tcand_t c = t.cand[i]
    cdef int64_t up
    while i > 0:
        up = (i - 1) >> 1
        if not _better(t, &c, &t.cand[up]):
            break
        t.cand[i] = t.cand[up]
        i = up
    t.cand[i] = c


cdef inline void _heap_pop(tree_t* t, tcand_t* out) noexcept nogil:
    """Take the best candidate into out."""
    cdef int64_t i = 0, kid, n
    cdef tcand_t c
    out[0] = t.cand[0]
    t.ncand -= 1
    n = t.ncand
    if n == 0:
        return
    c = t.cand[n]
    while True:
        kid = 2 * i + 1
        if kid >= n:
            break
        if kid + 1 < n and _better(t, &t.cand[kid + 1], &t.cand[kid]):
            kid += 1
        if not _better(t, &t.cand[kid], &c):
            break
        t.cand[i] = t.cand[kid]
        i = kid
    t.cand[i] = c


cdef void _tree_spawn(tree_t* t, int32_t parent, int64_t d, int32_t lo, int32_t hi) noexcept nogil:
    """The children of a node at depth d whose occurrences are ix[lo:hi] become
    candidates (the node's segment is split among them)."""
    cdef const sam_t* m = t.m
    cdef int32_t j, q, v = lo, o
    cdef int64_t key, tok, e, rep, n
    cdef int64_t c[TREE_CTX]
    cdef int i, mk
    cdef double p
    cdef bint chain_in
    cdef tcand_t* cd
    if d >= t.depth:
        return
    for j in range(lo, hi):          # the occurrences that continue
        o = t.ix[j]
        if t.occ_e[o] + d < t.L:
            t.ix[v] = o
            v += 1
    _tree_group(t, d, lo, v)         # grouped by the next token
    j = lo
    while j < v:
        tok = t.key_a[j - lo]
        for i in range(TREE_CTX):
            c[i] = 0
        rep = t.occ_e[t.ix[j]]
        chain_in = False
        q = j
        while q < v:
            o = t.ix[q]
            e = t.occ_e[o]
            if t.key_a[q - lo] != tok:
                break
            mk = t.occ_m[o]
            if mk & CHAIN_BIT:
                chain_in = True
            for i in range(t.k):
                c[i] += (mk >> i) & 1
            if (e < rep) if t.earliest else (e > rep):
                rep = e
            q += 1
        p = 0.0
        if t.copying:
            if chain_in:
                p += CHAIN_W
            for i in range(t.k):
                if t.cnt[i]:
                    p += (<double>c[i]) / (<double>t.cnt[i]) * TREE_W[i]
        else:
            n = 1 if chain_in else 0
            for i in range(t.k):
                n += c[i]
            p = TREE_DECAY[d] * <double>n
        cd = &t.cand[t.ncand]
        cd.p = p
        cd.rep = rep
        cd.tok = tok
        cd.parent = parent
        cd.depth = <int32_t>(d + 1)
        cd.lo = j
        cd.hi = q
        t.ncand += 1
        _heap_up(t, t.ncand - 1)
        j = q


cdef int64_t _tree_agreement(const sam_t* m, int64_t L, int64_t a) noexcept nogil:
    """The twin's ``agreement``: of the last AGREE_SPAN tokens, how many the chain's
    occurrence (ending at a <= L), aligned with the end, has at the same place."""
    cdef int64_t j, n = 0
    for j in range(1, AGREE_SPAN + 1):
        if a - j < 0:
            break
        if _tk(m, L - j) == _tk(m, a - j):
            n += 1
    return n


cdef int64_t _tree_build(tree_t* t, int64_t budget, int64_t width, int64_t* toks,
                         int64_t* par, int32_t* nchild) noexcept nogil:
    """Best-first: returns the nodes written to toks/par (room for ``budget``)."""
    cdef int64_t nt = 0, root_children = 0, nocc, k
    cdef tcand_t c
    t.copying = t.chain >= 0 and _tree_agreement(t.m, t.L, t.chain) >= AGREE_MIN
    if t.copying and t.chain < t.L:
        # the chain outweighs every other node, so when it fills the budget it is the
        # tree: no occurrence needs counting
        k = t.L - t.chain
        if k > t.depth:
            k = t.depth
        if k >= budget:
            for nt in range(budget):
                toks[nt] = _tk(t.m, t.chain + nt)
                par[nt] = nt - 1
            return budget
    _tree_contexts(t)
    _tree_scan(t)
    nocc = t.ncand
    if nocc == 0:
        return 0
    t.ncand = 0
    _tree_spawn(t, -1, 0, 0, <int32_t>nocc)
    while nt < budget and t.ncand > 0:
        _heap_pop(t, &c)
        if c.parent < 0:
            if root_children >= width:
                continue
            root_children += 1
        else:
            if nchild[c.parent] >= width:
                continue
            nchild[c.parent] += 1
        toks[nt] = c.tok
        par[nt] = c.parent
        nchild[nt] = 0
        nt += 1
        _tree_spawn(t, <int32_t>(nt - 1), c.depth, c.lo, c.hi)
    return nt


cdef tuple _tree_arrays(const sam_t* m, int64_t L, int64_t budget, int64_t depth, int64_t width):
    """``propose_tree``'s result for checked limits (the caller checked the guard; the
    tree is built before any Python object is made)."""
    cdef tree_t* t = <tree_t*>malloc(sizeof(tree_t) + <size_t>budget * 20)
    cdef int64_t n
    cdef int64_t* toks
    cdef int64_t* par
    if t == NULL:
        raise MemoryError()
    toks = <int64_t*>(<char*>t + sizeof(tree_t))
    par = toks + budget
    t.m = m
    t.L = L
    t.depth = depth
    t.earliest = m.earliest
    t.chain = _start(m)
    n = _tree_build(t, budget, width, toks, par, <int32_t*>(par + budget))
    cdef cnp.npy_intp dims = n
    try:
        a = cnp.PyArray_EMPTY(1, &dims, cnp.NPY_INT64, 0)
        b = cnp.PyArray_EMPTY(1, &dims, cnp.NPY_INT64, 0)
        if n:
            memcpy(cnp.PyArray_DATA(<cnp.ndarray>a), toks, n * sizeof(int64_t))
            memcpy(cnp.PyArray_DATA(<cnp.ndarray>b), par, n * sizeof(int64_t))
    finally:
        free(t)
    return a, b


def propose_tree_batch(indexes, budget, max_depth=None, max_width=None):
    cdef list ixs = _index_list(indexes)
    cdef int64_t bud, dep, wid, n = len(ixs), i, total = 0, got
    bud, dep, wid = check_tree_args(budget, max_depth, max_width)
    cdef tree_t* t = <tree_t*>malloc(sizeof(tree_t) + <size_t>bud * 4)
    cdef int64_t* toks = <int64_t*>malloc(<size_t>(n * bud if n else 1) * 2 * sizeof(int64_t))
    cdef int64_t* par
    cdef int64_t* ov
    cdef cnp.npy_intp dims = n + 1
    cdef sam_t* m
    try:
        if t == NULL or toks == NULL:
            raise MemoryError()
        par = toks + n * bud
        off = cnp.PyArray_EMPTY(1, &dims, cnp.NPY_INT64, 0)
        ov = <int64_t*>cnp.PyArray_DATA(<cnp.ndarray>off)
        ov[0] = 0
        # every guard checked after the last step that could run Python code, and no
        # Python code runs from the checks to the last tree
        for i in range(n):
            guard_check(_guard_of(ixs[i]), NAME)
        for i in range(n):
            m = &(<SuffixIndex>ixs[i]).m
            t.m = m
            t.L = (<SuffixIndex>ixs[i])._len
            t.depth = dep
            t.earliest = m.earliest
            t.chain = _start(m)
            got = _tree_build(t, bud, wid, toks + total, par + total,
                              <int32_t*>(<char*>t + sizeof(tree_t)))
            total += got
            ov[i + 1] = total
        dims = total
        a = cnp.PyArray_EMPTY(1, &dims, cnp.NPY_INT64, 0)
        p = cnp.PyArray_EMPTY(1, &dims, cnp.NPY_INT64, 0)
        if total:
            memcpy(cnp.PyArray_DATA(<cnp.ndarray>a), toks, total * sizeof(int64_t))
            memcpy(cnp.PyArray_DATA(<cnp.ndarray>p), par, total * sizeof(int64_t))
    finally:
        free(t)
        free(toks)
    return a, p, off
