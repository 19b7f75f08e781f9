# Shared by the kernel modules (Cython `include`): how many OpenMP threads a kernel uses.
from openmp cimport omp_get_max_threads

# Below this many elements of work a kernel runs on one thread: waking a second thread
# costs more than it saves, and on a busy machine a parallel region can wait a whole
# scheduler slice for a descheduled thread.
cdef enum:
    PARALLEL_MIN_WORK = 32768


cdef inline int _threads(Py_ssize_t work) noexcept nogil:
    if work < PARALLEL_MIN_WORK:
        return 1
    return omp_get_max_threads()


# Work items per grab for a dynamically scheduled prange, so that a grab covers at least ~16K
# elements (the atomic hand-out stays a small cost). Dynamic rather than static scheduling: on a
# busy machine a descheduled thread then holds back one grab at the end, not half of the work
# (results do not depend on it: each item's output and partial sums are fixed).
cdef inline Py_ssize_t _grab(Py_ssize_t item_elements) noexcept nogil:
    if item_elements >= 16384:
        return 1
    return 16384 // (item_elements if item_elements > 0 else 1)
