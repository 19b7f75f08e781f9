# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Direct 2-D grouped convolution for depthwise and small-group layers (MobileNet v1/v2, ResNeXt).

Lowering plus one GEMM per group is poor when a group is tiny: a depthwise layer
(group == channels) would run one (1 x 9) @ (9 x P) product per channel. These
kernels convolve directly, one (image, group) per OpenMP task. Shapes, with
g = group, cg = C / g input and og = Co / g output channels per group:

  x  (N, C, H, W)      the image side          w  (Co, cg, kh, kw)   (Caffe's weight blob)
  y  (N, Co, OH, OW)   the column side         OH = (H + 2 ph - (dh (kh - 1) + 1)) // sh + 1

  forward          y[n, o] = b[o] + sum_{c, i, j} w[o, c, i, j] x[n, g(o) cg + c, oh sh - ph + i dh, ...]
  backward_data    dx = the adjoint of forward (overwrites dx)
  backward_weight  dw += the correlation of dy with x (Caffe accumulates parameter gradients)

Deconvolution uses the same three with the roles of the sides swapped (its forward
is backward_data).

Each input plane a task reads is first copied into a zero-padded float64 plane whose
columns are split by phase modulo the stride: padded column ow * sw + j * dw is then
entry ow + (j * dw) // sw of phase (j * dw) % sw, so every kernel tap reads (or, for
backward_data, writes) a contiguous run of the plane with no bounds tests: loops the
compiler vectorizes. Sums are taken in float64: the forward of a float32 layer is the
float64 sum (bias included) rounded once, as the short-K exact GEMM path gives it
(conv_base.EXACT_FORWARD_MAX_K), and the weight gradient's sums over the batch are
float64 too.
"""
from cython.parallel cimport parallel, prange
from libc.stdlib cimport malloc, free
from libc.string cimport memset
include "_threads.pxi"

ctypedef fused real:
    float
    double


ctypedef struct Geom:
    Py_ssize_t N, C, H, W, Co, cg, og, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW
    Py_ssize_t Hp, Wq, row  # padded plane: Hp rows of sw phases of Wq entries (row = sw * Wq)


cdef Geom _geometry(Py_ssize_t N, Py_ssize_t C, Py_ssize_t H, Py_ssize_t W, Py_ssize_t Co,
                    Py_ssize_t group, Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t sh, Py_ssize_t sw,
                    Py_ssize_t ph, Py_ssize_t pw, Py_ssize_t dh, Py_ssize_t dw, Py_ssize_t OH, Py_ssize_t OW,
                    Py_ssize_t im_size, Py_ssize_t w_size, Py_ssize_t col_size) except *:
    """The checked sizes of one call (im_size, w_size, col_size: the buffers' lengths)."""
    cdef Geom g
    if min(N, C, H, W, Co, group, kh, kw, sh, sw, dh, dw, OH, OW) < 1 or min(ph, pw) < 0:
        raise ValueError("depthwise: sizes must be positive (pads non-negative)")
    if C % group or Co % group:
        raise ValueError("depthwise: group must divide the input and output channels")
    if OH != (H + 2 * ph - (dh * (kh - 1) + 1)) // sh + 1 or OW != (W + 2 * pw - (dw * (kw - 1) + 1)) // sw + 1:
        raise ValueError("depthwise: output size does not match the geometry")
    g.N, g.C, g.H, g.W, g.Co = N, C, H, W, Co
    g.cg, g.og = C // group, Co // group
    g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw = kh, kw, sh, sw, ph, pw, dh, dw
    g.OH, g.OW = OH, OW
    g.Hp = H + 2 * ph
    g.Wq = (W + 2 * pw + sw - 1) // sw
    g.row = sw * g.Wq
    if im_size < N * C * H * W:
        raise ValueError("depthwise: image-side buffer too small")
    if w_size < Co * g.cg * kh * kw:
        raise ValueError("depthwise: weight buffer too small")
    if col_size < N * Co * OH * OW:
        raise ValueError("depthwise: column-side buffer too small")
    return g


cdef inline Py_ssize_t _tap(const Geom* g, Py_ssize_t j) noexcept nogil:
    """Offset in a padded plane's row of kernel column j's run (its phase, then its start)."""
    return ((j * g.dw) % g.sw) * g.Wq + (j * g.dw) // g.sw


cdef inline void _phase_range(const Geom* g, Py_ssize_t q, Py_ssize_t* lo, Py_ssize_t* hi) noexcept nogil:
    """Entries k of phase q that hold an unpadded column (0 <= k * sw + q - pw < W) form [lo, hi)."""
    cdef Py_ssize_t a = g.pw - q, b = g.W + g.pw - q  # k * sw in [a, b)
    lo[0] = (a + g.sw - 1) // g.sw if a > 0 else 0
    hi[0] = (b + g.sw - 1) // g.sw if b > 0 else 0
    if hi[0] > g.Wq:
        hi[0] = g.Wq
    if lo[0] > hi[0]:
        lo[0] = hi[0]


cdef inline void _pad_plane(const real* src, double* dst, const Geom* g) noexcept nogil:
    """dst = src (H x W) zero-padded to Hp x (sw * Wq), columns split by phase."""
    cdef Py_ssize_t h, q, k, lo, hi, sw = g.sw, Wq = g.Wq, row = g.row, W = g.W
    cdef const real* s
    cdef double* d
    memset(dst, 0, g.ph * row * sizeof(double))
    memset(dst + (g.ph + g.H) * row, 0, (g.Hp - g.ph - g.H) * row * sizeof(double))
    for q in range(sw):  # phase by phase: the range is the same on every row
        _phase_range(g, q, &lo, &hi)
        for h in range(g.H):
            s = src + h * W + q - g.pw  # entry k of phase q is column k * sw + q - pw
            d = dst + (h + g.ph) * row + q * Wq
            for k in range(lo):
                d[k] = 0
            if sw == 1:
                for k in range(lo, hi):
                    d[k] = s[k]
            elif sw == 2:
                for k in range(lo, hi):
                    d[k] = s[2 * k]
            else:
                for k in range(lo, hi):
                    d[k] = s[k * sw]
            for k in range(hi, Wq):
                d[k] = 0


cdef inline void _unpad_plane(const double* src, real* dst, const Geom* g) noexcept nogil:
    """dst (H x W) = the unpadded interior of a padded phase plane, each entry rounded once."""
    cdef Py_ssize_t h, q, k, lo, hi, sw = g.sw, Wq = g.Wq, row = g.row, W = g.W
    cdef const double* s
    cdef real* d
    for q in range(sw):
        _phase_range(g, q, &lo, &hi)
        for h in range(g.H):
            s = src + (h + g.ph) * row + q * Wq
            d = dst + h * W + q - g.pw
            if sw == 1:
                for k in range(lo, hi):
                    d[k] = <real>s[k]
            else:
                for k in range(lo, hi):
                    d[k * sw] = <real>s[k]


# -- forward ----------------------------------------------------------------------------------

cdef enum:
    FLAT_MAX = 4096  # a small plane's padded outputs (doubles) computed in one pass: L1-sized


cdef inline bint _flat(const Geom* g) noexcept nogil:
    """Depthwise 3x3 at stride 1 on a small plane: computed as one flat loop over the padded width."""
    return (g.cg == 1 and g.kh == 3 and g.kw == 3 and g.sh == 1 and g.sw == 1
            and g.OH * g.row <= FLAT_MAX)


cdef inline void _forward_flat(const double* plane, const real* wg, const real* bias, real* y, double* acc,
                               const Geom* g) noexcept nogil:
    """Stride 1: output (oh, ow) reads padded entry (oh + i dh) * row + ow + j dw, so over the flat index
    q = oh * row + ow all nine taps are constant offsets: one long loop instead of OH short ones (the
    columns ow >= OW it also computes are dropped; the plane has a zeroed tail for their reads)."""
    cdef Py_ssize_t o, q, oh, ow, n = g.OH * g.row, OW = g.OW, row = g.row
    cdef Py_ssize_t a = g.dh * row, c = g.dw
    cdef double w0, w1, w2, w3, w4, w5, w6, w7, w8, b
    cdef const real* wk
    cdef const double* p = plane
    for o in range(g.og):
        wk = wg + o * 9
        w0, w1, w2, w3, w4, w5, w6, w7, w8 = wk[0], wk[1], wk[2], wk[3], wk[4], wk[5], wk[6], wk[7], wk[8]
        b = bias[o] if bias != NULL else 0.0
        for q in range(n):
            acc[q] = (b + w0 * p[q] + w1 * p[q + c] + w2 * p[q + 2 * c]
                      + w3 * p[q + a] + w4 * p[q + a + c] + w5 * p[q + a + 2 * c]
                      + w6 * p[q + 2 * a] + w7 * p[q + 2 * a + c] + w8 * p[q + 2 * a + 2 * c])
        for oh in range(g.OH):
            for ow in range(OW):
                y[(o * g.OH + oh) * OW + ow] = <real>acc[oh * row + ow]


cdef inline void _forward_group(const double* planes, const real* wg, const real* bias, real* y,
                                double* acc, const Geom* g) noexcept nogil:
    """The og output planes of one group from its cg padded input planes (wg: the group's filters)."""
    cdef Py_ssize_t o, oh, ow, c, i, j, t, OW = g.OW, kh = g.kh, kw = g.kw, plane = g.Hp * g.row + 2 * (g.dw + 1)
    cdef Py_ssize_t t0, t1, t2
    cdef const double* r
    cdef const real* wk
    cdef double w0, w1, w2, w3, w4, w5, w6, w7, w8, wv, b
    cdef const double* r0
    cdef const double* r1
    cdef const double* r2
    cdef real* yrow
    t0, t1, t2 = _tap(g, 0), _tap(g, 1 if kw > 1 else 0), _tap(g, 2 if kw > 2 else 0)
    if _flat(g):
        _forward_flat(planes, wg, bias, y, acc, g)
        return
    for o in range(g.og):
        b = bias[o] if bias != NULL else 0.0
        for oh in range(g.OH):
            yrow = y + (o * g.OH + oh) * OW
            if g.cg == 1 and kh == 3 and kw == 3:  # depthwise 3x3: the nine taps in one pass
                wk = wg + o * 9
                w0, w1, w2, w3, w4, w5, w6, w7, w8 = wk[0], wk[1], wk[2], wk[3], wk[4], wk[5], wk[6], wk[7], wk[8]
                r0 = planes + (oh * g.sh) * g.row
                r1 = planes + (oh * g.sh + g.dh) * g.row
                r2 = planes + (oh * g.sh + 2 * g.dh) * g.row
                for ow in range(OW):
                    yrow[ow] = <real>(b + w0 * r0[t0 + ow] + w1 * r0[t1 + ow] + w2 * r0[t2 + ow]
                                      + w3 * r1[t0 + ow] + w4 * r1[t1 + ow] + w5 * r1[t2 + ow]
                                      + w6 * r2[t0 + ow] + w7 * r2[t1 + ow] + w8 * r2[t2 + ow])
                continue
            for ow in range(OW):
                acc[ow] = b
            for c in range(g.cg):
                wk = wg + (o * g.cg + c) * kh * kw
                for i in range(kh):
                    r = planes + c * plane + (oh * g.sh + i * g.dh) * g.row
                    if kw == 3:
                        w0, w1, w2 = wk[i * 3], wk[i * 3 + 1], wk[i * 3 + 2]
                        for ow in range(OW):
                            acc[ow] += w0 * r[t0 + ow] + w1 * r[t1 + ow] + w2 * r[t2 + ow]
                    else:
                        for j in range(kw):
                            wv = wk[i * kw + j]
                            t = _tap(g, j)
                            for ow in range(OW):
                                acc[ow] += wv * r[t + ow]
            for ow in range(OW):
                yrow[ow] = <real>acc[ow]


def forward(const real[::1] x, const real[::1] w, const real[::1] bias, real[::1] y,
            Py_ssize_t N, Py_ssize_t C, Py_ssize_t H, Py_ssize_t W, Py_ssize_t Co, Py_ssize_t group,
            Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t ph, Py_ssize_t pw,
            Py_ssize_t dh, Py_ssize_t dw, Py_ssize_t OH, Py_ssize_t OW):
    """y (N, Co, OH, OW) = the grouped convolution of x (N, C, H, W) with w (+ bias when not None)."""
    cdef Geom g = _geometry(N, C, H, W, Co, group, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW,
                            x.shape[0], w.shape[0], y.shape[0])
    if bias is not None and bias.shape[0] < Co:
        raise ValueError("depthwise: bias buffer too small")
    cdef const real* xs = &x[0]
    cdef const real* ws = &w[0]
    cdef const real* bs = &bias[0] if bias is not None else NULL
    cdef real* ys = &y[0]
    # each padded plane has a zeroed tail of 2 (dw + 1) for the flat loop's reads past its last row
    cdef Py_ssize_t t, n, grp, c, cg = g.cg, og = g.og, plane = g.Hp * g.row + 2 * (dw + 1)
    cdef Py_ssize_t nacc = FLAT_MAX if _flat(&g) and FLAT_MAX > OW else OW
    cdef double* planes
    cdef double* acc
    cdef int nt = _threads(N * Co * OH * OW * cg * kh * kw)
    with nogil, parallel(num_threads=nt):
        planes = <double*>malloc((cg * plane + nacc) * sizeof(double))
        if planes == NULL:
            with gil:
                raise MemoryError()
        else:
            memset(planes, 0, cg * plane * sizeof(double))
            acc = planes + cg * plane
            for t in prange(N * group, schedule="dynamic"):
                n = t // group
                grp = t - n * group
                for c in range(cg):
                    _pad_plane(xs + (n * C + grp * cg + c) * H * W, planes + c * plane, &g)
                _forward_group(planes, ws + grp * og * cg * kh * kw, bs + grp * og if bs != NULL else NULL,
                               ys + (n * Co + grp * og) * OH * OW, acc, &g)
            free(planes)


# -- backward: the bottom (image-side) diff ------------------------------------------------------

cdef inline void _data_plane(const real* dy, const real* w, double* acc, Py_ssize_t cl,
                             const Geom* g) noexcept nogil:
    """Scatter the group's og output diffs (dy: its first plane) through the filters of input channel
    cl (w: the group's first filter) into the padded phase plane acc (zeroed here)."""
    cdef Py_ssize_t o, oh, ow, i, j, t, OW = g.OW, kh = g.kh, kw = g.kw
    cdef const real* dyrow
    cdef double* r
    cdef double wv
    memset(acc, 0, g.Hp * g.row * sizeof(double))
    for o in range(g.og):
        for oh in range(g.OH):
            dyrow = dy + (o * g.OH + oh) * OW
            for i in range(kh):
                r = acc + (oh * g.sh + i * g.dh) * g.row
                for j in range(kw):
                    wv = w[((o * g.cg + cl) * kh + i) * kw + j]
                    t = _tap(g, j)
                    for ow in range(OW):
                        r[t + ow] += wv * dyrow[ow]


def backward_data(const real[::1] dy, const real[::1] w, real[::1] dx,
                  Py_ssize_t N, Py_ssize_t C, Py_ssize_t H, Py_ssize_t W, Py_ssize_t Co, Py_ssize_t group,
                  Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t ph, Py_ssize_t pw,
                  Py_ssize_t dh, Py_ssize_t dw, Py_ssize_t OH, Py_ssize_t OW):
    """Overwrite dx (N, C, H, W) with the adjoint of forward applied to dy (N, Co, OH, OW)."""
    cdef Geom g = _geometry(N, C, H, W, Co, group, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW,
                            dx.shape[0], w.shape[0], dy.shape[0])
    cdef const real* dys = &dy[0]
    cdef const real* ws = &w[0]
    cdef real* dxs = &dx[0]
    cdef Py_ssize_t t, n, c, grp, cg = g.cg, og = g.og
    cdef double* acc
    cdef int nt = _threads(N * Co * OH * OW * cg * kh * kw)
    with nogil, parallel(num_threads=nt):
        acc = <double*>malloc(g.Hp * g.row * sizeof(double))
        if acc == NULL:
            with gil:
                raise MemoryError()
        else:
            for t in prange(N * C, schedule="dynamic"):
                n = t // C
                c = t - n * C
                grp = c // cg
                _data_plane(dys + (n * Co + grp * og) * OH * OW, ws + grp * og * cg * kh * kw, acc,
                            c - grp * cg, &g)
                _unpad_plane(acc, dxs + t * H * W, &g)
            free(acc)


# -- backward: the weight diff -------------------------------------------------------------------

cdef inline void _weight_pair(const double* xp, const real* dy, double* acc, const Geom* g) noexcept nogil:
    """Add into acc (kh * kw rows of OW doubles) the products of one output diff plane dy with the
    padded phase plane xp of the input channel it read."""
    cdef Py_ssize_t oh, ow, i, j, t, OW = g.OW, kh = g.kh, kw = g.kw
    cdef Py_ssize_t t0, t1, t2
    cdef const real* dyrow
    cdef const double* r
    cdef double* a
    cdef double* a1
    cdef double* a2
    cdef double d
    t0, t1, t2 = _tap(g, 0), _tap(g, 1 if kw > 1 else 0), _tap(g, 2 if kw > 2 else 0)
    for oh in range(g.OH):
        dyrow = dy + oh * OW
        for i in range(kh):
            r = xp + (oh * g.sh + i * g.dh) * g.row
            a = acc + i * kw * OW
            if kw == 3:
                a1 = a + OW
                a2 = a1 + OW
                for ow in range(OW):
                    d = dyrow[ow]
                    a[ow] += d * r[t0 + ow]
                    a1[ow] += d * r[t1 + ow]
                    a2[ow] += d * r[t2 + ow]
            else:
                for j in range(kw):
                    t = _tap(g, j)
                    for ow in range(OW):
                        a[j * OW + ow] += dyrow[ow] * r[t + ow]


def backward_weight(const real[::1] x, const real[::1] dy, real[::1] dw_,
                    Py_ssize_t N, Py_ssize_t C, Py_ssize_t H, Py_ssize_t W, Py_ssize_t Co, Py_ssize_t group,
                    Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t ph, Py_ssize_t pw,
                    Py_ssize_t dh, Py_ssize_t dw, Py_ssize_t OH, Py_ssize_t OW):
    """dw_ (Co, cg, kh, kw) += sum over the batch and positions of dy[n, o] times the x it read."""
    cdef Geom g = _geometry(N, C, H, W, Co, group, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW,
                            x.shape[0], dw_.shape[0], dy.shape[0])
    cdef const real* xs = &x[0]
    cdef const real* dys = &dy[0]
    cdef real* ws = &dw_[0]
    cdef Py_ssize_t t, n, o, cl, k, ow, cg = g.cg, og = g.og, K = kh * kw, plane = g.Hp * g.row
    cdef double* acc
    cdef double* xp
    cdef double s
    cdef int nt = _threads(N * Co * OH * OW * cg * K)
    with nogil, parallel(num_threads=nt):
        acc = <double*>malloc((K * OW + plane) * sizeof(double))
        if acc == NULL:
            with gil:
                raise MemoryError()
        else:
            xp = acc + K * OW
            for t in prange(Co * cg, schedule="dynamic"):
                o = t // cg
                cl = t - o * cg
                memset(acc, 0, K * OW * sizeof(double))
                for n in range(N):
                    _pad_plane(xs + (n * C + (o // og) * cg + cl) * H * W, xp, &g)
                    _weight_pair(xp, dys + (n * Co + o) * OH * OW, acc, &g)
                for k in range(K):
                    s = 0
                    for ow in range(OW):
                        s = s + acc[k * OW + ow]
                    ws[t * K + k] = <real>(ws[t * K + k] + s)  # one rounding
            free(acc)
