"""Parameter: exposes a learned blob of parameter_param.shape as its top (data and diff shared).

The blob is not filled (zeros, as Caffe); a net fills it from a caffemodel or trains it.
"""
from caffe.blob import Blob
from caffe.layers.layer import Layer
from caffe.layers.registry import register_layer


@register_layer("Parameter")
class ParameterLayer(Layer):
    exact_num_bottom_blobs = 0
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        shape = list(self.layer_param.parameter_param.shape.dim)
        self.check(all(d >= 0 for d in shape), f"parameter_param.shape {shape} has a negative dimension")
        dt = top[0].dtype
        if self.blobs:
            loaded = self.blobs[0]
            self.check(list(loaded.shape) == shape, f"stored blob shape {loaded.shape} does not match "
                                                    f"parameter_param.shape {shape}")
            if loaded.dtype != dt:  # the top shares the blob's memory, so they must agree on dtype
                b = Blob(shape, dtype=dt)
                b.mutable_cpu_data()[...] = loaded.cpu_data()
                self.blobs[0] = b
        else:
            self.blobs = [Blob(shape, dtype=dt)]
            self.blobs[0].mutable_cpu_data()[...] = 0
        self.set_param_propagate_down(0, True)
        top[0].reshape(shape)

    def reshape(self, bottom, top):
        top[0].reshape_like(self.blobs[0])
        top[0].share_data(self.blobs[0])
        top[0].share_diff(self.blobs[0])

    def forward_xp(self, xp, bottom, top):
        pass  # the top is the parameter blob's memory

    def backward_xp(self, xp, top, propagate_down, bottom):
        pass  # the parameter's diff is the top's diff
