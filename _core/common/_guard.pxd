# The one guard of every compiled object that reads or writes its own buffers with the
# GIL released (the n-gram index, the suffix index, the batch state).
#
# A guard_t lives inside the object (a C struct field, zeroed by Cython's allocation,
# so a fresh object, one made with __new__ and never initialised, is UNINIT). The
# protocol, the same for every such class:
#   __cinit__      nothing to do (zeroed = UNINIT), or allocate
#   __init__       guard_begin_init(&g, name) first: refuses a second __init__ (a
#                  RuntimeError that changes nothing); the object stays refused
#                  (INITIALISING) until guard_end_init(&g) runs as the last statement,
#                  so an __init__ that fails part way leaves an object that refuses
#                  every call instead of one with half-built buffers.
#   every method   that reads the buffers: guard_read(&g, name) ... guard_done_read(&g)
#                  (readers counted, so a writer elsewhere is refused while they run);
#                  a short read that never releases the GIL and runs no Python code in
#                  between may use guard_check(&g, name) alone.
#   every method   that writes them: guard_write(&g, name) ... guard_done_write(&g) in a
#                  try/finally; the flag is set before anything that can release the GIL
#                  or run Python code, and cleared last.
#   broken         guard_break(&g) after a failure that left the buffers inconsistent
#                  (out of memory part way): every later call is refused.
#   self           guard_self(self, cls, name, what) first in a method that Cython
#                  does not check ``self`` for (a ``def`` method called unbound gets
#                  any object): a TypeError for anything but a ``cls``.
# Every other refusal is a RuntimeError naming the class, raised before anything changed.

cdef enum:
    GUARD_UNINIT = 0
    GUARD_INITIALISING = 1
    GUARD_READY = 2
    GUARD_BROKEN = 3

ctypedef struct guard_t:
    int phase          # GUARD_UNINIT .. GUARD_BROKEN
    int writing        # a writer holds the buffers
    long readers       # readers in progress (they may have released the GIL)


cdef inline int guard_begin_init(guard_t* g, str name) except -1:
    if g.phase != GUARD_UNINIT:
        raise RuntimeError(f"{name}.__init__ may be called only once")
    g.phase = GUARD_INITIALISING
    return 0


cdef inline void guard_end_init(guard_t* g) noexcept:
    g.phase = GUARD_READY


cdef inline int guard_check(const guard_t* g, str name) except -1:
    if g.phase != GUARD_READY:
        if g.phase == GUARD_BROKEN:
            raise RuntimeError(f"{name} ran out of memory part way through a change and is unusable")
        raise RuntimeError(f"{name} was not initialised (its __init__ never completed)")
    if g.writing:
        raise RuntimeError(
            f"{name} is being changed (by another thread, or by a callback inside a call on it)"
        )
    return 0


cdef inline int guard_write(guard_t* g, str name) except -1:
    guard_check(g, name)
    if g.readers:
        raise RuntimeError(f"{name} is being read by another thread")
    g.writing = 1
    return 0


cdef inline void guard_done_write(guard_t* g) noexcept:
    g.writing = 0


cdef inline int guard_read(guard_t* g, str name) except -1:
    guard_check(g, name)
    g.readers += 1
    return 0


cdef inline void guard_done_read(guard_t* g) noexcept:
    g.readers -= 1


cdef inline int guard_hold(guard_t* g, str name, object on) except -1:
    # a class's ``_hold_guard(on)`` test hook: take the writer flag as a writer would
    # (refusing like one), or, with ``on`` false, release it
    if on:
        guard_write(g, name)
    else:
        guard_done_write(g)
    return 0


cdef inline void guard_break(guard_t* g) noexcept:
    g.phase = GUARD_BROKEN


cdef inline int guard_self(object o, type cls, str name, str what) except -1:
    # a method's ``self``, refused (TypeError) unless it is a ``cls`` (``what``: "a
    # RecyclingTable"): a method called unbound gets any object, which Cython does not
    # check, and every method reads its fields as the class's
    if not isinstance(o, cls):
        raise TypeError(f"a method of {name} needs {what} of the same implementation, got "
                        f"{type(o).__module__}.{type(o).__name__}")
    return 0
