# The fused step's body (included by batch.pyx after ``batch_step.pxi``): ``_run_step``
# runs acceptance, emission with budgets and eos (``_emit``), each index kind's
# serving-step policy (``_serve``) and the commit (``_commit``), their shared working
# state one ``step_t``, on the batch's own scratch (the writer guard makes the step its
# only user), so the only memory a step allocates is the arrays of its ``StepResult``.

cdef enum:
    NOGIL_SLOTS = 256    # from this capacity on, the step's and pending's loops release the GIL


cdef int64_t* _grow(BatchState self, Py_ssize_t n, Py_ssize_t keep) except NULL:
    """The writers' scratch (``self._work``) with at least ``n`` entries, its first
    ``keep`` entries kept; pointers taken into it before a growth are stale. Only a
    caller holding the writer guard uses it."""
    cdef Py_ssize_t size
    if n > self._work_n:
        size = n if n > 2 * self._work_n else 2 * self._work_n
        grown = np.empty(size, dtype=np.int64)
        if keep:
            memcpy(_ptr(grown), self._work, keep * sizeof(int64_t))
        self._work_a = grown
        self._work = _ptr(grown)
        self._work_n = size
    return self._work


cdef inline void _record_args(BatchState self, const int64_t* av, const int64_t* pos_j,
                              Py_ssize_t count, const int64_t* eov, const int64_t* emv,
                              const int64_t* nbv, const int64_t* drv, int64_t* limv,
                              int64_t* ndv, int64_t* nav) noexcept nogil:
    """The serving-step policy's per-slot inputs for the live slots at positions
    ``pos_j``: the draft limit ``min(k_max, new budget)``, the verified draft's length,
    and what the drafter session records, the draft's agreement with what the slot
    emitted (the policy's input on every path; it equals the step's accepted count
    except where a rule rejects a matching prefix, MinRun, or a budget or eos cut the
    emission)."""
    cdef Py_ssize_t q, jj
    cdef int64_t lim, m
    for q in range(count):
        jj = pos_j[q]
        lim = nbv[jj]
        limv[q] = lim if lim < self._k_max else self._k_max
        # a tree slot verified no chain: its index records nothing for it (drafted 0)
        m = 0 if self._tree[av[jj]] else drv[jj]
        ndv[q] = m
        if m > eov[jj + 1] - eov[jj]:
            m = eov[jj + 1] - eov[jj]
        nav[q] = _prefix(&self._draft[av[jj], 0], emv + eov[jj], m) if m > 0 else 0


ctypedef struct step_t:
    # the step's working state: the arrays its passes share (the layout and the outputs
    # on the scratch or in the result's arrays) and what the emission pass counts
    int64_t* av               # the evaluated slots (the result's ``slots``)
    int64_t* ov               # their row offsets (a + 1), on the scratch
    const int64_t* rp         # the target rows
    int64_t* accv
    const int64_t* replv      # the probability rules' replacement per slot, or NULL
    int64_t* emv              # the emission, on the writers' scratch (``_grow``)
    int64_t* eov
    int64_t* drv
    int64_t* rsv
    char* rbv
    int64_t* lvv              # the layout's slots, then the live n-gram positions j
    int64_t* svv              # the live SuffixIndex positions j
    # each slot's budget, token and state after the step, computed aside: the batch is
    # changed only once everything that can refuse has run (all or nothing)
    int64_t* nbv
    int64_t* ntv
    int64_t* nsv
    int64_t* finv             # the slots that finish
    int64_t* sqv              # the n-gram slots' next drafts (rows of k_max) and lengths
    int64_t* lnv
    int64_t* ssq              # the SuffixIndex slots' next drafts and lengths
    int64_t* sln
    int64_t minrun            # MinRun's minimum, or -1
    bint computed             # greedy exact or MinRun: the accepted counts computed here
    Py_ssize_t w, nlive, nsuf, nfin
    int64_t bad               # the first row whose negative token would be emitted, or -1


cdef inline int _scratch_views(BatchState self, step_t* s) except -1:
    """The step's per-slot arrays on the batch's scratch (7 c + 1 entries)."""
    cdef Py_ssize_t c = self._c
    cdef int64_t* sc = &self._scratch[0]
    s.lvv = sc
    s.ov = sc + c
    s.svv = sc + 2 * c + 1
    s.nbv = sc + 3 * c + 1
    s.ntv = sc + 4 * c + 1
    s.nsv = sc + 5 * c + 1
    s.finv = sc + 6 * c + 1
    s.sqv = NULL
    s.lnv = NULL
    s.ssq = NULL
    s.sln = NULL
    return 0


cdef inline int64_t _emit_tree(BatchState self, Py_ssize_t i, Py_ssize_t j, step_t* e,
                               const int64_t* rows, int64_t* out, Py_ssize_t* wp,
                               int64_t* bad_at) noexcept nogil:
    """Slot ``i`` (position ``j``, its target rows at ``rows``) settles its tree verify
    greedily: the accepted path's tokens and the settle row's token go to ``out`` (the
    emission at ``wp[0]``, advanced past them). Returns the settle row where its token
    is negative (its place in the slot's emission into ``bad_at``), else -1; the path's
    tokens are the tree's own."""
    cdef int64_t n = 0, bad = -1
    cdef int64_t settle = _tree_settle(self, i, rows, out, &n, &e.rbv[j])
    e.rsv[j] = settle
    if out[n] < 0:
        bad = settle
        bad_at[0] = n
    e.accv[j] = n
    e.drv[j] = self._dlen[i]
    wp[0] += n + 1
    return bad


cdef inline int64_t _emit_chain(BatchState self, Py_ssize_t i, Py_ssize_t j, step_t* e,
                                const int64_t* rp, int64_t* emv, Py_ssize_t* wp,
                                int64_t* bad_at) noexcept nogil:
    """Slot ``i`` (position ``j``, its target rows at ``rp``) settles its chain verify:
    its accepted count (computed here for the greedy rules, MinRun rejecting a shorter
    matching prefix whole), the accepted draft tokens, then the bonus token (all
    accepted) or the replacement (the target's, or the probability rule's) go to the
    emission ``emv`` at ``wp[0]`` (advanced past them). Returns the row of a negative
    target token it emits (its place in the slot's emission into ``bad_at``), else -1."""
    cdef Py_ssize_t q, w = wp[0]
    cdef int64_t n, k = self._dlen[i], bad = -1
    cdef int64_t bonus = self._bonus
    if e.computed:
        n = _prefix(&self._draft[i, 0], rp, k)
        if n < e.minrun:
            n = 0
        e.accv[j] = n
    else:
        n = e.accv[j]
    for q in range(n):
        emv[w] = self._draft[i, q]
        w += 1
    if n == k:
        if bonus:
            emv[w] = rp[k]
            w += 1
            if rp[k] < 0:
                bad = k
                bad_at[0] = k
        e.rsv[j] = k - 1 + bonus
    else:
        if e.replv != NULL:
            emv[w] = e.replv[j]
        else:
            emv[w] = rp[n]
            if rp[n] < 0:
                bad = n
                bad_at[0] = n
        w += 1
        e.rsv[j] = n
        e.rbv[j] = 1          # settled through Rollback
    e.drv[j] = k
    wp[0] = w
    return bad


cdef inline bint _cut(BatchState self, Py_ssize_t i, const int64_t* out, Py_ssize_t room,
                      Py_ssize_t* cnt) noexcept nogil:
    """Slot ``i``'s emission ``out`` of ``cnt[0]`` tokens cut to its budget ``room`` and
    after its first eos (the kept count into ``cnt``); True where the slot finishes."""
    cdef Py_ssize_t q, n = cnt[0]
    cdef bint stop = n >= room
    if stop:
        n = room
    if self._has_eos[i]:
        for q in range(n):
            if out[q] == self._eos[i]:
                n = q + 1
                stop = True
                break
    cnt[0] = n
    return stop


cdef void _emit(BatchState self, Py_ssize_t a, step_t* e) noexcept nogil:
    """The step's pass 2 for its ``a`` active slots: each verify's accepted count (the
    greedy rules) and settle, emission with budgets and eos, and each slot's budget,
    token and state after the step (into ``nbv``, ``ntv``, ``nsv``), the finished slots
    and the live slots with an index of each kind; changes nothing of the batch."""
    cdef Py_ssize_t j, i, cnt, room, e0, w = 0, nlive = 0, nsuf = 0, nfin = 0
    cdef int code
    cdef int64_t r0, r1
    cdef bint stop
    cdef const int64_t* rp = e.rp
    cdef int64_t* emv = e.emv
    cdef int64_t bad_row, bad_at      # a negative token from a target row: its row, its place
    e.bad = -1
    for j in range(a):
        i = e.av[j]
        code = self._st[i]
        r0 = e.ov[j]
        e0 = w
        e.rbv[j] = 0
        bad_at = 0
        if code == C_VERIFY and self._tree[i]:
            bad_row = _emit_tree(self, i, j, e, rp + r0, emv + w, &w, &bad_at)
        elif code == C_VERIFY:
            bad_row = _emit_chain(self, i, j, e, rp + r0, emv, &w, &bad_at)
        else:
            r1 = e.ov[j + 1]
            emv[w] = rp[r1 - 1]
            w += 1
            e.rsv[j] = r1 - 1 - r0    # a prefill's last prompt row, a decode's row 0
            bad_row = -1
            if rp[r1 - 1] < 0:
                bad_row = r1 - 1 - r0
        cnt = w - e0
        room = self._budget[i]
        stop = _cut(self, i, emv + e0, room, &cnt)
        w = e0 + cnt
        if bad_row >= 0 and bad_at < cnt and e.bad < 0:
            e.bad = r0 + bad_row      # a negative token it would emit (cut ones are not)
        e.eov[j + 1] = w
        e.nbv[j] = room - cnt
        if stop:
            e.nsv[j] = C_DONE
            e.ntv[j] = 0
            e.finv[nfin] = i
            nfin += 1
        else:
            e.nsv[j] = C_DECODE
            e.ntv[j] = emv[w - 1]
            if self._has_ix[i] == IX_NGRAM:
                e.lvv[nlive] = j
                nlive += 1
            elif self._has_ix[i] == IX_SUFFIX:
                e.svv[nsuf] = j
                nsuf += 1
    e.w = w
    e.nlive = nlive
    e.nsuf = nsuf
    e.nfin = nfin


cdef int64_t* _serve_kind(BatchState self, step_t* s, const int64_t* pos_j, Py_ssize_t count,
                          bint gather, bint ngram, int64_t* wk, int64_t** sq,
                          int64_t** ln) except NULL:
    """One index kind's serving-step policy for its ``count`` live slots at positions
    ``pos_j``, on the scratch from ``wk``: the emitted tokens (gathered per slot unless
    ``gather`` is False, where these slots are all the step's and the emission is read
    in place), the policy's per-slot inputs (``_record_args``), then the module's call
    (``ngram_serve`` with ``ngram``, else ``suffix_serve``): each verified draft recorded,
    the emitted tokens extended, the next draft proposed into ``sq[0]`` (rows of k_max),
    its lengths into ``ln[0]``, checked. Returns the scratch past what it used."""
    cdef Py_ssize_t kmax = self._k_max
    cdef int64_t* srcp = s.emv
    cdef int64_t* offp = s.eov
    cdef list index_list = _pick(self._index, s.av, pos_j, count)
    if gather:
        offp = wk
        srcp = wk + count + 1
        _gather(pos_j, count, s.eov, s.emv, offp, srcp)
        wk = srcp + offp[count]
    cdef int64_t* limv = wk
    cdef int64_t* ndv = wk + count
    cdef int64_t* nav = wk + 2 * count
    sq[0] = wk + 3 * count
    ln[0] = sq[0] + count * kmax
    _record_args(self, s.av, pos_j, count, s.eov, s.emv, s.nbv, s.drv, limv, ndv, nav)
    if ngram:
        ngram_serve(index_list, count, srcp, offp, ndv, nav, limv, kmax, sq[0], ln[0])
    else:
        suffix_serve(index_list, count, srcp, offp, ndv, nav, limv, kmax, sq[0], ln[0])
    _check_drafts_out(self, count, ln[0])
    return ln[0] + count


cdef int _serve(BatchState self, step_t* s, Py_ssize_t a) except -1:
    """Each live slot's index policy: the index update and next drafts into
    ``nlive + nsuf`` rows of k_max on the scratch after the emission (each policy call
    refuses before it changes any index)."""
    cdef Py_ssize_t nlive = s.nlive, nsuf = s.nsuf, w = s.w
    cdef list index_list
    if nlive + nsuf:
        s.emv = _grow(self, w + 2 * (w + 1) + (nlive + nsuf) * (self._k_max + 6) + 8, w)
    cdef int64_t* wk = s.emv + w
    if nlive and nsuf:
        # two module calls: what would refuse the second is checked before the first
        index_list = _pick(self._index, s.av, s.svv, nsuf)
        _check_distinct(index_list)
        _si.propose_batch(index_list, 0)       # refuses an index in use, changes nothing
    if nlive:
        # the n-gram module's policy (``ngram_serve``): extend and propose in one pass
        # without the GIL, each verified draft recorded first, on this step's buffers
        wk = _serve_kind(self, s, s.lvv, nlive, nlive != a, True, wk, &s.sqv, &s.lnv)
    if nsuf:
        # SuffixIndex slots: the suffix module's policy, as the drafter session serves
        # one request: each verified draft recorded, the emitted tokens extended, the
        # next draft proposed
        _serve_kind(self, s, s.svv, nsuf, True, False, wk, &s.ssq, &s.sln)
    return 0


cdef int _commit(BatchState self, const step_t* s, Py_ssize_t a, int64_t* dov) except -1:
    """The batch changed to the step's outcome: each evaluated slot's budget, token and
    state, the slots with a next draft entered into Verify (``_apply_drafts``), and the
    drafts' offsets into ``dov`` (a + 1 entries). Nothing here refuses."""
    cdef Py_ssize_t j, i
    cdef const int64_t* av = s.av
    cdef const int64_t* nbv = s.nbv
    cdef const int64_t* ntv = s.ntv
    cdef const int64_t* nsv = s.nsv
    memset(dov, 0, (a + 1) * sizeof(int64_t))
    for j in range(a):
        i = av[j]
        if self._st[i] == C_VERIFY:
            self._dlen[i] = 0
            self._snap[i] = 0
            self._tree[i] = 0
        elif self._st[i] == C_PREFILL:
            self._positions[i] = None    # the prompt of a slot that left Prefill
        self._budget[i] = nbv[j]
        self._tok[i] = ntv[j]
        self._st[i] = <int8_t>nsv[j]
    if s.nsuf:
        _apply_drafts(self, s.av, s.svv, s.nsuf, s.ssq, s.sln, dov)
    if s.nlive:
        _apply_drafts(self, s.av, s.lvv, s.nlive, s.sqv, s.lnv, dov)
    if s.nlive + s.nsuf:
        for j in range(a):
            dov[j + 1] += dov[j]
    return 0


cdef object _drafts_out(BatchState self, const int64_t* av, const int64_t* dov, Py_ssize_t a):
    """The result's ``drafts``: each evaluated slot's next draft, at ``dov``'s offsets."""
    cdef Py_ssize_t j, i, t
    if not dov[a]:
        return _EMPTY
    drafts = _new(dov[a])
    cdef int64_t* dfv = _ptr(drafts)
    for j in range(a):
        i = av[j]
        for t in range(dov[j + 1] - dov[j]):
            dfv[dov[j] + t] = self._draft[i, t]
    return drafts


cdef inline object _copied(const int64_t* p, Py_ssize_t n):
    """A fresh 1-D int64 array of the ``n`` entries at ``p``."""
    out = _new(n)
    memcpy(_ptr(out), p, n * sizeof(int64_t))
    return out


cdef int _refuse_tree_rules(BatchState self, const int64_t* av, Py_ssize_t a) except -1:
    """A rule or probabilities given while a tree slot verifies: refused (the tree
    verify settles greedily)."""
    cdef Py_ssize_t j
    for j in range(a):
        if self._st[av[j]] == C_VERIFY and self._tree[av[j]]:
            raise _tree_rule_refusal(av[j])
    return 0


cdef object _step_rows(row_tokens, int kind, int64_t total):
    """The step's target rows, ``total`` of them, as a 1-D int64 array."""
    if not cnp.PyArray_Check(row_tokens):
        row_tokens = host_array(row_tokens, "row_tokens")   # a CPU tensor: a view, no copy
    if plain_int_width(row_tokens) == 8 and (kind == R_EXACT or kind == R_MINRUN):
        rows = row_tokens          # read in place: every index is checked below
    else:
        # a copy of its own where a rule's Python code runs before the rows are read
        # (the rule may rewrite the caller's array), as the twin's
        rows = int64_ids(row_tokens, "row_tokens")
    if array_len(rows) != total:
        raise ValueError(f"row_tokens holds {array_len(rows)} rows; this step evaluates {total}")
    return rows


cdef object _run_step(BatchState self, row_tokens, probs, rule, draft_probs):
    """``BatchState.step`` with the writer guard held by the caller: the layout, pass 1
    for the rules that need Python (``_rule_counts``), the emission (``_emit``), each
    index kind's policy (``_serve``), then the result's arrays and the commit
    (``_commit``)."""
    cdef int kind = R_EXACT
    cdef int64_t m = 0
    if rule is not None:
        kind, m = rule_kind(rule)
    cdef bint big = self._c >= NOGIL_SLOTS
    cdef step_t s
    _scratch_views(self, &s)
    cdef Py_ssize_t a
    if big:
        with nogil:
            a = _layout(self, s.lvv, s.ov, self._c)
    else:
        a = _layout(self, s.lvv, s.ov, self._c)
    act = _new(a)
    s.av = _ptr(act)
    memcpy(s.av, s.lvv, a * sizeof(int64_t))
    cdef int64_t total = s.ov[a]
    if rule is not None or probs is not None or draft_probs is not None:
        _refuse_tree_rules(self, s.av, a)
    rows = _step_rows(row_tokens, kind, total)
    s.rp = <const int64_t*>array_data(rows)
    acc = _new(a)
    s.accv = _ptr(acc)
    memset(s.accv, 0, a * sizeof(int64_t))
    # pass 1 for the rules that need Python (probability kernels, other rules)
    repl = None
    if kind == R_SPEC or kind == R_TYPICAL or kind == R_OTHER:
        repl = _rule_counts(self, kind, rule, probs, draft_probs, act, _copied(s.ov, a + 1),
                            rows, total, acc)
    s.replv = _ptr(repl) if repl is not None else NULL
    # outputs; the emission goes to the scratch first (its length is known after the loop)
    eoff = _new(a + 1)
    drafted = _new(a)
    resume = _new(a)
    cdef cnp.npy_intp dims = a
    rolled = cnp.PyArray_EMPTY(1, &dims, cnp.NPY_BOOL, 0)
    s.rbv = <char*>cnp.PyArray_DATA(<cnp.ndarray>rolled)
    s.emv = _grow(self, total + a, 0)
    s.eov = _ptr(eoff)
    s.drv = _ptr(drafted)
    s.rsv = _ptr(resume)
    s.eov[0] = 0
    memset(s.drv, 0, a * sizeof(int64_t))
    s.minrun = m if kind == R_MINRUN else -1
    s.computed = kind == R_EXACT or kind == R_MINRUN
    if big:
        with nogil:
            _emit(self, a, &s)
    else:
        _emit(self, a, &s)
    if s.bad >= 0:
        raise negative_row(rows, s.bad, act, _copied(s.ov, a + 1))
    _serve(self, &s, a)
    # the result's arrays, then the commit: nothing below can refuse or run Python code
    emitted = _copied(s.emv, s.w)
    fin = _copied(s.finv, s.nfin) if s.nfin else _EMPTY
    dr_off = _new(a + 1)
    _commit(self, &s, a, _ptr(dr_off))
    drafts = _drafts_out(self, s.av, _ptr(dr_off), a)
    cdef StepResult res = StepResult.__new__(StepResult)
    res.slots = act
    res.emitted = emitted
    res.emitted_offsets = eoff
    res.accepted = acc
    res.drafted = drafted
    res.resume_rows = resume
    res.finished = fin
    res.drafts = drafts
    res.draft_offsets = dr_off
    res.rolled_back = rolled
    return res
