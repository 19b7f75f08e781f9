# Shared by the kernel modules (Cython `include`): outputs written past the caches, and prefetching a range.
# A plain store first reads each line it writes from main memory (write-allocate), so an output written by plain
# stores costs twice its size in traffic; non-temporal stores write it once. A kernel that streamed ends its work
# item with caffe_store_fence() (the lines are then visible to every thread).
cdef extern from *:
    """
    #ifndef CAFFE_STREAM_PXI
    #define CAFFE_STREAM_PXI
    #include <stddef.h>
    #include <stdint.h>
    #include <string.h>
    #if defined(__SSE2__)
    #include <immintrin.h>
    #endif
    /* dst = src (n bytes), non-temporal where the build can:
       plain stores up to dst's first 64-byte line and after its last whole one */
    static inline void caffe_stream_copy(void* dst, const void* src, ptrdiff_t n) {
        char* d = (char*)dst;
        const char* s = (const char*)src;
        ptrdiff_t j = 0;
    #if defined(__SSE2__)
        ptrdiff_t head = (ptrdiff_t)((64 - ((uintptr_t)d & 63)) & 63);
        if (head > n) head = n;
        if (head) memcpy(d, s, (size_t)head);
        j = head;
    #if defined(__AVX512F__)
        for (; j + 64 <= n; j += 64)
            _mm512_stream_si512((__m512i*)(d + j), _mm512_loadu_si512((const void*)(s + j)));
    #elif defined(__AVX__)
        for (; j + 64 <= n; j += 64) {
            _mm256_stream_si256((__m256i*)(d + j), _mm256_loadu_si256((const __m256i*)(s + j)));
            _mm256_stream_si256((__m256i*)(d + j + 32), _mm256_loadu_si256((const __m256i*)(s + j + 32)));
        }
    #else
        for (; j + 64 <= n; j += 64) {
            _mm_stream_si128((__m128i*)(d + j), _mm_loadu_si128((const __m128i*)(s + j)));
            _mm_stream_si128((__m128i*)(d + j + 16), _mm_loadu_si128((const __m128i*)(s + j + 16)));
            _mm_stream_si128((__m128i*)(d + j + 32), _mm_loadu_si128((const __m128i*)(s + j + 32)));
            _mm_stream_si128((__m128i*)(d + j + 48), _mm_loadu_si128((const __m128i*)(s + j + 48)));
        }
    #endif
    #endif
        if (j < n) memcpy(d + j, s + j, (size_t)(n - j));
    }
    /* the streamed lines are visible to every thread (ordered before the later plain stores / the region's end) */
    static inline void caffe_store_fence(void) {
    #if defined(__SSE2__)
        _mm_sfence();
    #endif
    }
    /* every line of [p, p + nbytes) asked for ahead of use: into all cache levels (t0), or all but L1 (t1: a range
       read a while later, which should not push out what L1 holds now) */
    #if defined(__GNUC__)
    #define CAFFE_PREFETCH_LINES(p, nbytes, locality) do { \\
            const char* c_ = (const char*)(p); \\
            for (ptrdiff_t b_ = 0; b_ < (nbytes); b_ += 64) __builtin_prefetch(c_ + b_, 0, locality); \\
        } while (0)
    #else
    #define CAFFE_PREFETCH_LINES(p, nbytes, locality) ((void)(p))
    #endif
    static inline void caffe_prefetch_t0(const void* p, ptrdiff_t nbytes) { CAFFE_PREFETCH_LINES(p, nbytes, 3); }
    static inline void caffe_prefetch_t1(const void* p, ptrdiff_t nbytes) { CAFFE_PREFETCH_LINES(p, nbytes, 2); }
    #endif
    """
    void caffe_stream_copy(void* dst, const void* src, Py_ssize_t nbytes) nogil
    void caffe_store_fence() nogil
    void caffe_prefetch_t0(const void* p, Py_ssize_t nbytes) nogil
    void caffe_prefetch_t1(const void* p, Py_ssize_t nbytes) nogil
