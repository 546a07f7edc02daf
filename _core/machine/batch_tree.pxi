# Tree slots of the batch (included by batch.pyx): ``enter_verify_tree``'s checks and
# transition, the node check it runs per tree, the greedy walk ``step`` settles a tree
# slot with, and ``pending_trees``. A tree slot is a VERIFY slot with ``_tree`` set: its
# N node tokens in the draft buffer, its parents in ``_par`` (both at most k_max).

#: why ``accept``/``accept_rows`` refuse a slot in a tree verify (the twin's TREE_SETTLE)
cdef str _TREE_SETTLE = "the slot is in a tree verify, which step settles (greedy)"


cdef object _tree_rule_refusal(int64_t slot):
    """``step`` given a rule or probabilities while ``slot`` (the first) is in a tree verify."""
    return ValueError(
        f"slot {slot} is in a tree verify, which settles greedily only: step takes no rule, "
        "probs or draft_probs while a tree verify is pending"
    )


cdef int _tree_nodes(const int64_t* t, const int64_t* p, Py_ssize_t n, int64_t* first,
                     int64_t* nxt, Py_ssize_t* bad_i, Py_ssize_t* bad_j) noexcept nogil:
    """One tree's check (``specfsm.tree.check_tree``'s rules, in its order: each node's
    token and parent first, then the first node with a later sibling of its token):
    0, or the refusal's code (``specfsm.tree._checks``) at node ``bad_i`` (``bad_j``: that
    sibling). ``first`` (n + 1) and ``nxt`` (n) are scratch: each parent's children as
    linked lists in index order."""
    cdef Py_ssize_t i, s
    cdef int64_t q
    for i in range(n):
        q = p[i]
        if t[i] < 0:
            bad_i[0] = i
            return _TREE_NEGATIVE_TOKEN
        if q < -1:
            bad_i[0] = i
            return _TREE_PARENT_BELOW_ROOT
        if q >= i:
            bad_i[0] = i
            return _TREE_PARENT_NOT_BEFORE
    for i in range(n + 1):
        first[i] = -1
    for i in range(n - 1, -1, -1):     # p[i] + 1 lies in [0, i] now
        nxt[i] = first[p[i] + 1]
        first[p[i] + 1] = i
    for i in range(n):
        s = nxt[i]
        while s >= 0:
            if t[s] == t[i]:
                bad_i[0] = i
                bad_j[0] = s
                return _TREE_DUPLICATE_SIBLING
            s = nxt[s]
    return 0


cdef bint _tree_ok(const int64_t* t, const int64_t* p, Py_ssize_t n, int64_t* head,
                   int64_t* nxt) noexcept nogil:
    """Whether a tree of ``n`` nodes passes ``_tree_nodes`` (the same rules), in one pass:
    parents come before their children, so each node meets only its earlier siblings
    (``head``, n + 1 entries, lists each parent's children so far, initialised as its
    node appears). Cheaper; a refusal is then located by ``_tree_nodes``, which finds
    the one the message names."""
    cdef Py_ssize_t i
    cdef int64_t q, s, tok
    head[0] = -1
    for i in range(n):
        q = p[i]
        tok = t[i]
        if tok < 0 or q < -1 or q >= i:
            return False
        s = head[q + 1]
        while s >= 0:
            if t[s] == tok:
                return False
            s = nxt[s]
        nxt[i] = head[q + 1]
        head[q + 1] = i
        head[i + 1] = -1
    return True


cdef int _fast_enter_verify_tree(BatchState self, slots, tokens, parents, offsets) except -1:
    """``enter_verify_tree``'s usual call (``batch_fast.pxi``'s readers: plain int32/int64
    arrays or lists of ints) applied (1), or declined with nothing changed (0): anything
    the general path would refuse declines, and that path raises the one message."""
    cdef Py_ssize_t b = fast_len(slots), nt = fast_len(tokens), no = fast_len(offsets)
    if b <= 0 or b > self._c or nt < 0 or no != b + 1 or fast_len(parents) != nt:
        return 0
    cdef Py_ssize_t kmax = self._k_max
    cdef int64_t* s = _grow(self, b + 2 * nt + no + 2 * kmax + 1, 0)
    cdef int64_t* tk = s + b
    cdef int64_t* pr = tk + nt
    cdef int64_t* o = pr + nt
    cdef int64_t* first = o + no
    cdef int64_t* nxt = first + kmax + 1
    if (fast_read(slots, b, s) or fast_read(tokens, nt, tk) or fast_read(parents, nt, pr)
            or fast_read(offsets, no, o)):
        return 0
    cdef int64_t n = longest_row(o, no, nt, 1), lo
    if n < 0 or n > kmax:
        return 0
    cdef Py_ssize_t j, i
    for j in range(b):
        lo = o[j]
        if not _tree_ok(tk + lo, pr + lo, o[j + 1] - lo, first, nxt):
            return 0
    if not _fast_slots(self, s, b, 1 << DECODE):
        return 0
    for j in range(b):
        i = s[j]
        lo = o[j]
        n = o[j + 1] - lo
        memcpy(&self._draft[i, 0], tk + lo, n * sizeof(int64_t))
        memcpy(&self._par[i, 0], pr + lo, n * sizeof(int64_t))
        self._dlen[i] = n
        self._tree[i] = 1
        self._st[i] = C_VERIFY
        self._snap[i] = self._cache[i]
    return 1


cdef _enter_verify_tree(BatchState self, slots, tokens, parents, offsets):
    if _fast_enter_verify_tree(self, slots, tokens, parents, offsets):
        return
    s = check_slots(slots, self._c)
    t, off = slot_ragged(tokens, offsets, s.shape[0], "tokens")
    p = ids64(parents, "parents")
    check_lengths(t.shape[0], p.shape[0], batch=True)
    _check_from(self, "enter_verify_tree", s)
    cdef Py_ssize_t b = s.shape[0], j, i, q, bi = -1, bj = -1
    cdef int64_t n, lo
    cdef int code
    cdef const int64_t* sv = _ptr(s)
    cdef const int64_t* tv = _ptr(t)
    cdef const int64_t* pv = _ptr(p)
    cdef const int64_t* ov = _ptr(off)
    cdef int64_t* first = _grow(self, 2 * self._k_max + 1, 0)
    cdef int64_t* nxt = first + self._k_max + 1
    for j in range(b):
        n = ov[j + 1] - ov[j]
        if n == 0:
            raise ValueError(f"the tree for slot {sv[j]} is empty: a tree verify needs at least one node")
        if n > self._k_max:
            raise ValueError(f"the tree for slot {sv[j]} holds {n} nodes, more than k_max={self._k_max}")
        lo = ov[j]
        if _tree_ok(tv + lo, pv + lo, n, first, nxt):
            continue
        code = _tree_nodes(tv + lo, pv + lo, n, first, nxt, &bi, &bj)
        if code:
            raise tree_error(code, bi, bj, tv[lo + bi], pv[lo + bi], f"slot {sv[j]}: ")
    for j in range(b):
        i = sv[j]
        lo = ov[j]
        n = ov[j + 1] - lo
        for q in range(n):
            self._draft[i, q] = tv[lo + q]
            self._par[i, q] = pv[lo + q]
        self._dlen[i] = n
        self._tree[i] = 1
        self._st[i] = C_VERIFY
        self._snap[i] = self._cache[i]


cdef inline int64_t _tree_settle(BatchState self, Py_ssize_t i, const int64_t* rows, int64_t* emv,
                                 int64_t* n_out, char* more_out) noexcept nogil:
    """Greedy acceptance of slot ``i``'s tree over its N + 1 ``rows``: the accepted
    nodes' tokens then the target's token at the settle row into ``emv`` (``n_out[0]``
    nodes), whether the last accepted node (the root when none) has children into
    ``more_out``; returns the settle row. Children come after their parent, so one pass
    in index order meets every child of the current node after it."""
    cdef Py_ssize_t q, k = self._dlen[i]
    cdef int64_t cur = -1, want = rows[0], n = 0
    cdef char more = 0
    for q in range(k):
        if self._par[i, q] == cur:
            if self._draft[i, q] == want:
                emv[n] = want
                n += 1
                cur = q
                want = rows[q + 1]
                more = 0
            else:
                more = 1
    emv[n] = want
    n_out[0] = n
    more_out[0] = more
    return cur + 1


cdef tuple _pending_trees(BatchState self):
    cdef Py_ssize_t i, j, q, nt = 0, total = 0
    for i in range(self._c):
        if self._st[i] == C_VERIFY and self._tree[i]:
            nt += 1
            total += self._dlen[i]
    slots = _new(nt)
    par = _new(total)
    off = _new(nt + 1)
    cdef int64_t* sv = _ptr(slots)
    cdef int64_t* pv = _ptr(par)
    cdef int64_t* ov = _ptr(off)
    ov[0] = 0
    j = 0
    for i in range(self._c):
        if self._st[i] == C_VERIFY and self._tree[i]:
            sv[j] = i
            for q in range(self._dlen[i]):
                pv[ov[j] + q] = self._par[i, q]
            ov[j + 1] = ov[j] + self._dlen[i]
            j += 1
    return slots, par, off
