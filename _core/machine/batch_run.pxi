# The fused step's body (included by batch.pyx after ``batch_step.pxi``): ``_run_step``
# runs acceptance, emission with budgets and eos, each index kind's serving-step policy
# and the commit on the batch's own scratch (the writer guard makes the step its only
# user), so the only memory a step allocates is the arrays of its ``StepResult``.

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


ctypedef struct emit_t:
    # the emission pass's arrays (see ``_emit``) and what it counts
    const int64_t* av
    const int64_t* ov
    const int64_t* rp
    int64_t* accv
    const int64_t* replv      # the probability rules' replacement per slot, or NULL
    int64_t* emv
    int64_t* eov
    int64_t* drv
    int64_t* rsv
    char* rbv
    int64_t* lvv
    int64_t* svv
    int64_t* nbv
    int64_t* ntv
    int64_t* nsv
    int64_t* finv
    int64_t minrun            # MinRun's minimum, or -1
    bint computed             # greedy exact or MinRun: the accepted counts computed here
    Py_ssize_t w, nlive, nsuf, nfin
    int64_t bad               # the first row whose negative token would be emitted, or -1


cdef void _emit(BatchState self, Py_ssize_t a, emit_t* e) noexcept nogil:
    """The step's pass 2 for its ``a`` active slots: each verify's accepted count (the
    greedy rules) and settle, emission with budgets and eos, and each slot's budget,
    token and state after the step (into ``nbv``, ``ntv``, ``nsv``), the finished slots
    and the live slots with an index of each kind; changes nothing of the batch."""
    cdef Py_ssize_t j, i, q, cnt, room, e0, w = 0, nlive = 0, nsuf = 0, nfin = 0
    cdef int code
    cdef int64_t r0, r1, k, n, bonus = self._bonus
    cdef bint stop
    cdef const int64_t* rp = e.rp
    cdef int64_t* emv = e.emv
    cdef int64_t bad_row, bad_at      # a negative token from a target row: its row, its place
    e.bad = -1
    for j in range(a):
        i = e.av[j]
        code = self._st[i]
        r0 = e.ov[j]
        r1 = e.ov[j + 1]
        e0 = w
        e.rbv[j] = 0
        bad_row = -1
        bad_at = 0
        if code == C_VERIFY and self._tree[i]:
            e.rsv[j] = _tree_settle(self, i, rp + r0, emv + w, &n, &e.rbv[j])
            if emv[w + n] < 0:        # the settle row's token (the path's are the tree's)
                bad_row = e.rsv[j]
                bad_at = n
            e.accv[j] = n
            e.drv[j] = self._dlen[i]
            w += n + 1
        elif code == C_VERIFY:
            k = self._dlen[i]
            if e.computed:
                n = _prefix(&self._draft[i, 0], rp + r0, k)
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
                    emv[w] = rp[r0 + k]
                    w += 1
                    if rp[r0 + k] < 0:
                        bad_row = k
                        bad_at = k
                e.rsv[j] = k - 1 + bonus
            else:
                if e.replv != NULL:
                    emv[w] = e.replv[j]
                else:
                    emv[w] = rp[r0 + n]
                    if rp[r0 + n] < 0:
                        bad_row = n
                        bad_at = n
                w += 1
                e.rsv[j] = n
                e.rbv[j] = 1          # settled through Rollback
            e.drv[j] = k
        else:
            emv[w] = rp[r1 - 1]
            w += 1
            e.rsv[j] = r1 - 1 - r0    # a prefill's last prompt row, a decode's row 0
            if rp[r1 - 1] < 0:
                bad_row = r1 - 1 - r0
        cnt = w - e0
        room = self._budget[i]
        stop = cnt >= room
        if stop:
            cnt = room
        if self._has_eos[i]:
            for q in range(cnt):
                if emv[e0 + q] == self._eos[i]:
                    cnt = q + 1
                    stop = True
                    break
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


cdef object _run_step(BatchState self, row_tokens, probs, rule, draft_probs):
    """``BatchState.step`` with the writer guard held by the caller."""
    cdef int kind = R_EXACT
    cdef int64_t m = 0
    if rule is not None:
        kind, m = rule_kind(rule)
    cdef Py_ssize_t c = self._c, kmax = self._k_max
    cdef bint big = c >= NOGIL_SLOTS
    cdef int64_t* sc = &self._scratch[0]
    cdef int64_t* lvv = sc                  # the layout's slots, then the live n-gram positions j
    cdef int64_t* ov = sc + c               # the layout's row offsets (a + 1)
    cdef int64_t* svv = sc + 2 * c + 1      # the live SuffixIndex positions j
    # each slot's budget, token and state after the step, computed aside: the batch is
    # changed only once everything that can refuse has run (all or nothing)
    cdef int64_t* nbv = sc + 3 * c + 1
    cdef int64_t* ntv = sc + 4 * c + 1
    cdef int64_t* nsv = sc + 5 * c + 1
    cdef int64_t* finv = sc + 6 * c + 1
    cdef Py_ssize_t a
    if big:
        with nogil:
            a = _layout(self, lvv, ov, c)
    else:
        a = _layout(self, lvv, ov, c)
    act = _new(a)
    cdef int64_t* av = _ptr(act)
    memcpy(av, lvv, a * sizeof(int64_t))
    cdef int64_t total = ov[a]
    cdef Py_ssize_t jt
    if rule is not None or probs is not None or draft_probs is not None:
        for jt in range(a):
            if self._st[av[jt]] == C_VERIFY and self._tree[av[jt]]:
                raise _tree_rule_refusal(av[jt])
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
    cdef const int64_t* rp = <const int64_t*>array_data(rows)
    acc = _new(a)
    cdef int64_t* accv = _ptr(acc)
    memset(accv, 0, a * sizeof(int64_t))
    # pass 1 for the rules that need Python (probability kernels, other rules)
    repl = None
    if kind == R_SPEC or kind == R_TYPICAL or kind == R_OTHER:
        off = _new(a + 1)
        memcpy(_ptr(off), ov, (a + 1) * sizeof(int64_t))
        repl = _rule_counts(self, kind, rule, probs, draft_probs, act, off, rows, total, acc)
    cdef int64_t* replv = _ptr(repl) if repl is not None else NULL
    # outputs; the emission goes to the scratch first (its length is known after the loop)
    eoff = _new(a + 1)
    drafted = _new(a)
    resume = _new(a)
    cdef cnp.npy_intp dims = a
    rolled = cnp.PyArray_EMPTY(1, &dims, cnp.NPY_BOOL, 0)
    cdef char* rbv = <char*>cnp.PyArray_DATA(<cnp.ndarray>rolled)
    cdef int64_t* emv = _grow(self, total + a, 0)
    cdef int64_t* eov = _ptr(eoff)
    cdef int64_t* drv = _ptr(drafted)
    cdef int64_t* rsv = _ptr(resume)
    eov[0] = 0
    memset(drv, 0, a * sizeof(int64_t))
    cdef emit_t em
    em.av = av
    em.ov = ov
    em.rp = rp
    em.accv = accv
    em.replv = replv
    em.emv = emv
    em.eov = eov
    em.drv = drv
    em.rsv = rsv
    em.rbv = rbv
    em.lvv = lvv
    em.svv = svv
    em.nbv = nbv
    em.ntv = ntv
    em.nsv = nsv
    em.finv = finv
    em.minrun = m if kind == R_MINRUN else -1
    em.computed = kind == R_EXACT or kind == R_MINRUN
    if big:
        with nogil:
            _emit(self, a, &em)
    else:
        _emit(self, a, &em)
    if em.bad >= 0:
        off = _new(a + 1)
        memcpy(_ptr(off), ov, (a + 1) * sizeof(int64_t))
        raise negative_row(rows, em.bad, act, off)
    cdef Py_ssize_t nsuf = em.nsuf, nfin = em.nfin, nlive = em.nlive, w = em.w, j, i
    cdef int64_t t
    # index update and next drafts into nlive + nsuf rows of k_max on the scratch after
    # the emission (each policy call refuses before it changes any index)
    cdef Py_ssize_t nix = nlive + nsuf
    if nix:
        emv = _grow(self, w + 2 * (w + 1) + nix * (kmax + 6) + 8, w)
    cdef int64_t* wk = emv + w
    cdef int64_t* srcp
    cdef int64_t* offp
    cdef int64_t* sqv = NULL
    cdef int64_t* lnv = NULL
    cdef int64_t* ssq = NULL
    cdef int64_t* sln = NULL
    cdef int64_t* limv
    cdef int64_t* ndv
    cdef int64_t* nav
    cdef list index_list
    if nlive and nsuf:
        # two module calls: what would refuse the second is checked before the first
        index_list = _pick(self._index, av, svv, nsuf)
        _check_distinct(index_list)
        _si.propose_batch(index_list, 0)       # refuses an index in use, changes nothing
    if nlive:
        # the n-gram module's policy (``ngram_serve``): extend and propose in one pass
        # without the GIL, each verified draft recorded first, on this step's buffers
        index_list = _pick(self._index, av, lvv, nlive)
        if nlive == a:
            srcp = emv
            offp = eov
        else:
            offp = wk
            srcp = wk + nlive + 1
            _gather(lvv, nlive, eov, emv, offp, srcp)
            wk = srcp + offp[nlive]
        limv = wk
        ndv = wk + nlive
        nav = wk + 2 * nlive
        sqv = wk + 3 * nlive
        lnv = sqv + nlive * kmax
        wk = lnv + nlive
        _record_args(self, av, lvv, nlive, eov, emv, nbv, drv, limv, ndv, nav)
        ngram_serve(index_list, nlive, srcp, offp, ndv, nav, limv, kmax, sqv, lnv)
        _check_drafts_out(self, nlive, lnv)
    if nsuf:
        # SuffixIndex slots: the suffix module's policy, as the drafter session serves
        # one request: each verified draft recorded, the emitted tokens extended, the
        # next draft proposed
        index_list = _pick(self._index, av, svv, nsuf)
        offp = wk
        srcp = wk + nsuf + 1
        _gather(svv, nsuf, eov, emv, offp, srcp)
        wk = srcp + offp[nsuf]
        limv = wk
        ndv = wk + nsuf
        nav = wk + 2 * nsuf
        ssq = wk + 3 * nsuf
        sln = ssq + nsuf * kmax
        _record_args(self, av, svv, nsuf, eov, emv, nbv, drv, limv, ndv, nav)
        suffix_serve(index_list, nsuf, srcp, offp, ndv, nav, limv, kmax, ssq, sln)
        _check_drafts_out(self, nsuf, sln)
    # the result's arrays, then the commit: nothing below can refuse or run Python code
    emitted = _new(w)
    memcpy(_ptr(emitted), emv, w * sizeof(int64_t))
    if nfin:
        fin = _new(nfin)
        memcpy(_ptr(fin), finv, nfin * sizeof(int64_t))
    else:
        fin = _EMPTY
    dr_off = _new(a + 1)
    cdef int64_t* dov = _ptr(dr_off)
    memset(dov, 0, (a + 1) * sizeof(int64_t))
    drafts = _EMPTY
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
    if nsuf:
        _apply_drafts(self, av, svv, nsuf, ssq, sln, dov)
    if nlive:
        _apply_drafts(self, av, lvv, nlive, sqv, lnv, dov)
    cdef int64_t* dfv
    if nix:
        for j in range(a):
            dov[j + 1] += dov[j]
        if dov[a]:
            drafts = _new(dov[a])
            dfv = _ptr(drafts)
            for j in range(a):
                i = av[j]
                for t in range(dov[j + 1] - dov[j]):
                    dfv[dov[j] + t] = self._draft[i, t]
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
