"""caffe.layers.kernels: the compiled CPU kernels, one module per family of computation.

  lowering   im2col / col2im (convolution's lowering to GEMM and its inverse, by blocks of
             output rows) and the batch <-> GEMM-rows layout changes
  depthwise  direct grouped 2-D convolution, forward and both backward passes, for
             depthwise / small-group layers (MobileNet)
  conv_direct_avx2  the direct dense convolution (stride 1): forward, and weight diff vectorized over
             output channels (AVX2 + FMA, AVX-512 variants chosen at run time; conv_cpu's "dense" plan)
  gemm       an AVX-512 packed float32 GEMM (bias and activation in its store; any strided A and B),
             chosen at run time for the convolutions' GEMMs (the 1x1 plan's, and the blocked plan's but
             a valid layer's) where NumPy's OpenBLAS runs AVX2 kernels (conv_cpu.GEMM512)
  exact_gemm the exact short-K convolution forward: float64 sums of float32 products, rounded
             once, from float32 data (AVX2 + FMA; conv_cpu.EXACT_GEMM); and such a layer's weight
             gradient, long float64 sums rounded once (dots_nt; conv_cpu.EXACT_WGRAD)
  pooling    2-D MAX / AVE pooling forward and backward
  elementwise    the neuron layers, Eltwise, Dropout (its SplitMix64 mask), Split's sum, Concat/Slice copies
  channelwise    per-channel operands on (outer, dim, inner): Scale(+Bias), Bias, PReLU, BatchNorm global stats
  normalization  BatchNorm with batch statistics (sums in double), LRN across channels
  softmax        Softmax forward / backward, SoftmaxWithLoss's gradient
  rng            the gaussian fill (gaussian / msra fillers, DummyData): counter-based Box-Muller from a seed
  update         the solvers' parameter updates in one pass (the six solvers: caffe-solver's on the CPU)
  skinny_gemm    InnerProduct's three products at a short batch (1-16 rows): one pass over the
                 weights (float32)
  *_avx2, *_avx512  the same sources compiled for AVX2 / AVX-512 (elementwise_avx2.pyx ...), chosen at
             import by caffe.layers._cpu where the CPU has them
  _threads   (Cython include) how many OpenMP threads a kernel takes
  _splitmix  (Cython include) SplitMix64, Dropout's and the gaussian fill's generator (caffe.layers.splitmix
             is the same in NumPy)
  _vmath     (Cython include) libm functions declared SIMD-callable (glibc's libmvec)
  _vexp      (Cython include) the AVX-512 float32 exp's reduction and polynomial (elementwise, softmax)
  _stream    (Cython include) non-temporal copies, the store fence, prefetching a range (normalization, softmax)

Each kernel has a plain NumPy reference that the property tests compare it to (the
layer's generic `forward_xp` path, or a reference function in the tests). The
array-module-generic code in the layer modules stays the GPU path.
"""
