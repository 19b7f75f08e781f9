"""caffe.layers.kernels: the compiled CPU kernels, one module per family of computation.

  lowering   im2col / col2im (convolution's lowering to GEMM and its inverse, by blocks of
             output rows) and the batch <-> GEMM-rows layout changes
  depthwise  direct grouped 2-D convolution, forward and both backward passes, for
             depthwise / small-group layers (MobileNet)
  pooling    2-D MAX / AVE pooling forward and backward
  _threads   (Cython include) how many OpenMP threads a kernel takes

Each kernel has a plain NumPy reference that the property tests compare it to (the
layer's generic `forward_xp` path, or a reference function in the tests). The
array-module-generic code in the layer modules stays the GPU path.
"""
