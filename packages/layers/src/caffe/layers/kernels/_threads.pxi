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
