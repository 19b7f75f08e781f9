# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -fno-math-errno -fno-trapping-math
"""2-D MAX / AVE pooling on the CPU, OpenMP-parallel over (image, channel) planes.

The loops are Caffe's PoolingLayer::Forward_cpu / Backward_cpu (pooling_layer.cpp),
plane by plane:
  MAX: window [hstart, hend) clipped to the image; running max starts at -FLT_MAX and
       only a strictly greater value replaces it, so the first maximum in row-major
       order wins; the argmax is stored as h * W + w (-1 for an empty window).
  AVE: the divisor is the window clipped to the padded extent (H + pad), computed
       before clipping to the image; the sum runs over the image part only.
Backward writes every bottom-diff plane (zero first, then scatter/accumulate), so
planes are independent and the parallel loop needs no atomics.
x / top are (planes, H, W) / (planes, PH, PW), contiguous and flattened.
"""
from cython.parallel cimport prange
include "_threads.pxi"
from libc.float cimport FLT_MAX

ctypedef fused real:
    float
    double


cdef inline void _pw_range(Py_ssize_t j, Py_ssize_t W, Py_ssize_t sw, Py_ssize_t pad_w, Py_ssize_t PW,
                           Py_ssize_t* lo, Py_ssize_t* hi) noexcept nogil:
    """The windows pw whose column pw * sw - pad_w + j lies inside the image form [lo, hi)."""
    cdef Py_ssize_t w0 = j - pad_w, a, b
    if w0 >= 0:
        a = 0
    else:
        a = (-w0 + sw - 1) // sw
    if W - w0 <= 0:
        b = 0
    else:
        b = (W - w0 + sw - 1) // sw
    if b > PW:
        b = PW
    if a > b:
        a = b
    lo[0] = a
    hi[0] = b


cdef inline void _max_plane(const real* x, real* y, int* mask, Py_ssize_t H, Py_ssize_t W,
                            Py_ssize_t PH, Py_ssize_t PW, Py_ssize_t kh, Py_ssize_t kw,
                            Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t pad_h,
                            Py_ssize_t pad_w) noexcept nogil:
    # Window by window, as Caffe; the running max is selected without branches (the comparison
    # is unpredictable on real data).
    cdef Py_ssize_t ph, pw, h, w, hs, he, ws, we
    cdef real m, v
    cdef int idx, sel
    for ph in range(PH):
        hs = ph * sh - pad_h
        he = hs + kh
        if he > H:
            he = H
        if hs < 0:
            hs = 0
        for pw in range(PW):
            ws = pw * sw - pad_w
            we = ws + kw
            if we > W:
                we = W
            if ws < 0:
                ws = 0
            m = -FLT_MAX
            idx = -1
            for h in range(hs, he):
                for w in range(ws, we):
                    v = x[h * W + w]
                    sel = -<int>(v > m)  # strictly greater: the first maximum wins, as in Caffe
                    idx = idx ^ ((idx ^ <int>(h * W + w)) & sel)
                    m = v if v > m else m
            y[ph * PW + pw] = m
            mask[ph * PW + pw] = idx


cdef inline void _max_row(const real* src, real* yr, int* mr, Py_ssize_t lo, Py_ssize_t hi, int base,
                          Py_ssize_t sw) noexcept nogil:
    """Windows lo..hi of an output row against their pixel src[sw pw] (index base + sw pw)."""
    cdef Py_ssize_t pw
    cdef real v, m
    cdef int old, sel
    for pw in range(lo, hi):  # (no branch: selects by masks, so that it vectorizes)
        v = src[sw * pw]
        m = yr[pw]
        old = mr[pw]
        sel = -<int>(v > m)
        mr[pw] = old ^ ((old ^ (base + <int>(sw * pw))) & sel)
        yr[pw] = v if v > m else m


cdef inline void _max_plane_rows(const real* x, real* y, int* mask, Py_ssize_t H, Py_ssize_t W,
                                 Py_ssize_t PH, Py_ssize_t PW, Py_ssize_t kh, Py_ssize_t kw,
                                 Py_ssize_t sh, Py_ssize_t pad_h, Py_ssize_t pad_w,
                                 Py_ssize_t sw) noexcept nogil:
    # Horizontal stride 1 or 2 (3x3/2 in ResNet, GoogLeNet, CaffeNet, SqueezeNet; 3x3/1 in
    # GoogLeNet's inception modules), a whole output row at a time. For each image row h of the
    # window and kernel column j, every window pw of the row compares its pixel (h, sw pw - pad_w
    # + j): a window sees its pixels in row-major order and only a strictly greater value replaces
    # the running max (from -FLT_MAX), so the first maximum wins, as in Caffe. _max_row is called
    # with a literal stride, so that (inlined) its loop has a constant stride and vectorizes.
    cdef Py_ssize_t ph, pw, h, j, hs, he, lo, hi
    cdef real* yr
    cdef int* mr
    cdef const real* src
    cdef int base
    for ph in range(PH):
        yr = y + ph * PW
        mr = mask + ph * PW
        for pw in range(PW):
            yr[pw] = -FLT_MAX
            mr[pw] = -1
        hs = ph * sh - pad_h
        he = hs + kh
        if he > H:
            he = H
        if hs < 0:
            hs = 0
        for h in range(hs, he):
            for j in range(kw):
                _pw_range(j, W, sw, pad_w, PW, &lo, &hi)
                src = x + h * W + j - pad_w
                base = <int>(h * W + j - pad_w)
                if sw == 1:
                    _max_row(src, yr, mr, lo, hi, base, 1)
                else:
                    _max_row(src, yr, mr, lo, hi, base, 2)


# AVE runs a whole output row at a time: for each image row h of the window and each kernel
# column j, every window pw of the row is updated. Each window still sums its pixels in
# Caffe's row-major order (h, then w = ws + j ascending), so the results are Caffe's to the
# bit, but the windows' independent additions pipeline instead of one window's serial chain.
cdef inline void _ave_plane(const real* x, real* y, Py_ssize_t H, Py_ssize_t W,
                            Py_ssize_t PH, Py_ssize_t PW, Py_ssize_t kh, Py_ssize_t kw,
                            Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t pad_h,
                            Py_ssize_t pad_w) noexcept nogil:
    cdef Py_ssize_t ph, pw, h, j, hs, he, hsize, ws, we, lo, hi
    cdef real* yr
    cdef const real* row
    for ph in range(PH):
        yr = y + ph * PW
        for pw in range(PW):
            yr[pw] = 0
        hs = ph * sh - pad_h
        he = hs + kh
        if he > H + pad_h:
            he = H + pad_h
        hsize = he - hs  # the divisor counts the padded extent (H + pad), before clipping
        if hs < 0:
            hs = 0
        if he > H:
            he = H
        for h in range(hs, he):
            row = x + h * W
            for j in range(kw):
                _pw_range(j, W, sw, pad_w, PW, &lo, &hi)
                for pw in range(lo, hi):
                    yr[pw] = yr[pw] + row[pw * sw - pad_w + j]
        for pw in range(PW):
            ws = pw * sw - pad_w
            we = ws + kw
            if we > W + pad_w:
                we = W + pad_w
            yr[pw] = yr[pw] / (hsize * (we - ws))


cdef inline void _max_back_plane(const real* dy, const int* mask, real* dx, Py_ssize_t HW,
                                 Py_ssize_t PHW) noexcept nogil:
    cdef Py_ssize_t k
    cdef int idx
    for k in range(HW):
        dx[k] = 0
    for k in range(PHW):
        idx = mask[k]
        if idx >= 0:
            dx[idx] = dx[idx] + dy[k]


cdef inline void _ave_back_plane(const real* dy, real* dx, Py_ssize_t H, Py_ssize_t W,
                                 Py_ssize_t PH, Py_ssize_t PW, Py_ssize_t kh, Py_ssize_t kw,
                                 Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t pad_h,
                                 Py_ssize_t pad_w) noexcept nogil:
    cdef Py_ssize_t ph, pw, h, j, hs, he, hsize, ws, we, lo, hi, k
    cdef const real* dr
    cdef real* row
    for k in range(H * W):
        dx[k] = 0
    for ph in range(PH):
        dr = dy + ph * PW
        hs = ph * sh - pad_h
        he = hs + kh
        if he > H + pad_h:
            he = H + pad_h
        hsize = he - hs
        if hs < 0:
            hs = 0
        if he > H:
            he = H
        for h in range(hs, he):
            row = dx + h * W
            # j descending: a pixel then receives its windows' shares in ascending pw, Caffe's order
            for j in range(kw - 1, -1, -1):
                _pw_range(j, W, sw, pad_w, PW, &lo, &hi)
                for pw in range(lo, hi):
                    ws = pw * sw - pad_w
                    we = ws + kw
                    if we > W + pad_w:
                        we = W + pad_w
                    row[pw * sw - pad_w + j] += dr[pw] / (hsize * (we - ws))


cdef inline void _ave_plane_global(const real* x, real* y, Py_ssize_t HW) noexcept nogil:
    """A window covering the whole (unpadded) plane: the sum in Caffe's row-major order / H * W."""
    cdef Py_ssize_t k
    cdef real acc = 0
    for k in range(HW):
        acc = acc + x[k]
    y[0] = acc / HW


cdef inline void _ave_back_plane_global(const real* dy, real* dx, Py_ssize_t HW) noexcept nogil:
    cdef Py_ssize_t k
    cdef real g = dy[0] / HW
    for k in range(HW):
        dx[k] = g


def _check(Py_ssize_t have, Py_ssize_t need, str what):
    if have < need:
        raise ValueError(f"pooling kernel: {what} buffer holds {have} elements, needs {need}")


cdef inline void _max_plane_2x2(const real* x, real* y, int* mask, Py_ssize_t W,
                                Py_ssize_t PH, Py_ssize_t PW) noexcept nogil:
    """The common 2x2 / stride 2 / no pad case on whole windows: the same strict-greater scan from
    -FLT_MAX in row-major order as _max_plane (so the same values and argmaxes), without its window
    bookkeeping."""
    cdef Py_ssize_t ph, pw, top
    cdef const real* r0
    cdef const real* r1
    cdef real m, v
    cdef int idx
    for ph in range(PH):
        r0 = x + 2 * ph * W
        r1 = r0 + W
        for pw in range(PW):
            m = -FLT_MAX
            idx = -1
            top = 2 * ph * W + 2 * pw
            v = r0[2 * pw]
            if v > m:
                m = v
                idx = <int>top
            v = r0[2 * pw + 1]
            if v > m:
                m = v
                idx = <int>(top + 1)
            v = r1[2 * pw]
            if v > m:
                m = v
                idx = <int>(top + W)
            v = r1[2 * pw + 1]
            if v > m:
                m = v
                idx = <int>(top + W + 1)
            y[ph * PW + pw] = m
            mask[ph * PW + pw] = idx


def max_pool_forward(const real[::1] x, real[::1] y, int[::1] mask, Py_ssize_t planes,
                     Py_ssize_t H, Py_ssize_t W, Py_ssize_t PH, Py_ssize_t PW,
                     Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t sh, Py_ssize_t sw,
                     Py_ssize_t pad_h, Py_ssize_t pad_w):
    """y = max over each window; mask = argmax (h * W + w within the plane, -1 if empty)."""
    cdef Py_ssize_t p
    if planes * PH * PW == 0:
        return
    _check(x.shape[0], planes * H * W, "bottom")
    _check(y.shape[0], planes * PH * PW, "top")
    _check(mask.shape[0], planes * PH * PW, "mask")
    cdef const real* xp = &x[0] if H * W > 0 else NULL
    cdef real* yp = &y[0]
    cdef int* mp = &mask[0]
    cdef int nt = _threads(planes * (H * W + PH * PW))
    cdef Py_ssize_t g = _grab(H * W + PH * PW)
    cdef bint whole_2x2 = (kh == 2 and kw == 2 and sh == 2 and sw == 2 and pad_h == 0 and pad_w == 0
                           and 2 * PH == H and 2 * PW == W)
    with nogil:
        if whole_2x2:
            for p in prange(planes, schedule="dynamic", chunksize=g, num_threads=nt):
                _max_plane_2x2(xp + p * H * W, yp + p * PH * PW, mp + p * PH * PW, W, PH, PW)
        elif sw == 2:
            for p in prange(planes, schedule="dynamic", chunksize=g, num_threads=nt):
                _max_plane_rows(xp + p * H * W, yp + p * PH * PW, mp + p * PH * PW, H, W, PH, PW,
                                kh, kw, sh, pad_h, pad_w, 2)
        elif sw == 1:
            for p in prange(planes, schedule="dynamic", chunksize=g, num_threads=nt):
                _max_plane_rows(xp + p * H * W, yp + p * PH * PW, mp + p * PH * PW, H, W, PH, PW,
                                kh, kw, sh, pad_h, pad_w, 1)
        else:
            for p in prange(planes, schedule="dynamic", chunksize=g, num_threads=nt):
                _max_plane(xp + p * H * W, yp + p * PH * PW, mp + p * PH * PW, H, W, PH, PW,
                           kh, kw, sh, sw, pad_h, pad_w)


def ave_pool_forward(const real[::1] x, real[::1] y, Py_ssize_t planes,
                     Py_ssize_t H, Py_ssize_t W, Py_ssize_t PH, Py_ssize_t PW,
                     Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t sh, Py_ssize_t sw,
                     Py_ssize_t pad_h, Py_ssize_t pad_w):
    """y = window sum / Caffe's pool size."""
    cdef Py_ssize_t p
    if planes * PH * PW == 0:
        return
    _check(x.shape[0], planes * H * W, "bottom")
    _check(y.shape[0], planes * PH * PW, "top")
    cdef const real* xp = &x[0] if H * W > 0 else NULL
    cdef real* yp = &y[0]
    cdef int nt = _threads(planes * (H * W + PH * PW))
    cdef Py_ssize_t g = _grab(H * W + PH * PW)
    cdef bint whole = PH == 1 and PW == 1 and kh == H and kw == W and pad_h == 0 and pad_w == 0
    with nogil:
        if whole:  # global pooling
            for p in prange(planes, schedule="dynamic", chunksize=g, num_threads=nt):
                _ave_plane_global(xp + p * H * W, yp + p, H * W)
        else:
            for p in prange(planes, schedule="dynamic", chunksize=g, num_threads=nt):
                _ave_plane(xp + p * H * W, yp + p * PH * PW, H, W, PH, PW, kh, kw, sh, sw,
                           pad_h, pad_w)


def max_pool_backward(const real[::1] dy, const int[::1] mask, real[::1] dx,
                      Py_ssize_t planes, Py_ssize_t HW, Py_ssize_t PHW):
    """dx = 0, then dx[mask] += dy, plane by plane."""
    cdef Py_ssize_t p
    if planes * HW == 0:
        return
    _check(dx.shape[0], planes * HW, "bottom diff")
    if PHW == 0:
        dx[:planes * HW] = 0
        return
    _check(dy.shape[0], planes * PHW, "top diff")
    _check(mask.shape[0], planes * PHW, "mask")
    cdef const real* dyp = &dy[0]
    cdef const int* mp = &mask[0]
    cdef real* dxp = &dx[0]
    cdef int nt = _threads(planes * (HW + PHW))
    cdef Py_ssize_t g = _grab(HW + PHW)
    with nogil:
        for p in prange(planes, schedule="dynamic", chunksize=g, num_threads=nt):
            _max_back_plane(dyp + p * PHW, mp + p * PHW, dxp + p * HW, HW, PHW)


def ave_pool_backward(const real[::1] dy, real[::1] dx, Py_ssize_t planes,
                      Py_ssize_t H, Py_ssize_t W, Py_ssize_t PH, Py_ssize_t PW,
                      Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t sh, Py_ssize_t sw,
                      Py_ssize_t pad_h, Py_ssize_t pad_w):
    """dx = 0, then every window spreads dy / pool size over its image part."""
    cdef Py_ssize_t p
    if planes * H * W == 0:
        return
    _check(dx.shape[0], planes * H * W, "bottom diff")
    if PH * PW == 0:
        dx[:planes * H * W] = 0
        return
    _check(dy.shape[0], planes * PH * PW, "top diff")
    cdef const real* dyp = &dy[0]
    cdef real* dxp = &dx[0]
    cdef int nt = _threads(planes * (H * W + PH * PW))
    cdef Py_ssize_t g = _grab(H * W + PH * PW)
    cdef bint whole = PH == 1 and PW == 1 and kh == H and kw == W and pad_h == 0 and pad_w == 0
    with nogil:
        if whole:
            for p in prange(planes, schedule="dynamic", chunksize=g, num_threads=nt):
                _ave_back_plane_global(dyp + p, dxp + p * H * W, H * W)
        else:
            for p in prange(planes, schedule="dynamic", chunksize=g, num_threads=nt):
                _ave_back_plane(dyp + p * PH * PW, dxp + p * H * W, H, W, PH, PW, kh, kw, sh, sw,
                                pad_h, pad_w)
