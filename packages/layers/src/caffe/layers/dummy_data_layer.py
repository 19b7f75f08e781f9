"""DummyData: tops of given shapes filled by fillers (Caffe's dummy_data_layer.cpp).

dummy_data_param gives 0, 1 or one data_filler per top (none: constant 0) and either
`shape` (once, or once per top) or the legacy num/channels/height/width fields (each
once, or once per top). Constant fillers fill once at setup; other fillers refill
at every Forward, with the runtime generator.
"""
from __future__ import annotations

from caffe.layers.filler import fill
from caffe.layers.layer import Layer
from caffe.layers.registry import register_layer


@register_layer("DummyData")
class DummyDataLayer(Layer):
    exact_num_bottom_blobs = 0
    min_top_blobs = 1

    def layer_setup(self, bottom, top):
        from caffe.proto import caffe_pb2
        p = self.layer_param.dummy_data_param
        num_top = len(top)
        num_fillers = len(p.data_filler)
        if num_fillers not in (0, 1, num_top):
            raise self.error(f"number of data fillers must be 0, 1 or equal to the number of tops "
                             f"({num_top}); you specified {num_fillers} data fillers")
        legacy = len(p.num) or len(p.channels) or len(p.height) or len(p.width)
        shapes = []
        if legacy:
            if len(p.shape):
                raise self.error("both shape and legacy fields (num, channels, height, width) were specified")
            for field in ("num", "channels", "height", "width"):
                n = len(getattr(p, field))
                if n not in (1, num_top):
                    raise self.error(f"{field} must be specified once, or once per top blob ({num_top}); "
                                     f"specified {n}")
            for i in range(num_top):
                shapes.append([getattr(p, f)[0 if len(getattr(p, f)) == 1 else i]
                               for f in ("num", "channels", "height", "width")])
        else:
            if len(p.shape) not in (1, num_top):
                raise self.error(f"must specify 'shape' once, or once per top blob ({num_top}); "
                                 f"specified {len(p.shape)}")
            for i in range(num_top):
                shapes.append(list(p.shape[0 if len(p.shape) == 1 else i].dim))
        if num_fillers == 0:
            constant = caffe_pb2.FillerParameter()
            constant.type = "constant"
            constant.value = 0
            self.fillers = [constant]
        else:
            self.fillers = list(p.data_filler)
        # Constant fillers need filling only once; the rest are refilled at every Forward.
        self.refill = [f.type != "constant" for f in self.fillers]
        for i, t in enumerate(top):
            t.reshape(shapes[i])
            f = self._filler_id(i)
            if not self.refill[f]:
                fill(t, self.fillers[f])

    def _filler_id(self, top_index: int) -> int:
        return top_index if len(self.fillers) > 1 else 0

    def reshape(self, bottom, top):
        pass

    def forward_cpu(self, bottom, top):
        for i, t in enumerate(top):
            f = self._filler_id(i)
            if self.refill[f]:
                fill(t, self.fillers[f])

    forward_gpu = forward_cpu

    def backward_cpu(self, top, propagate_down, bottom):
        pass

    backward_gpu = backward_cpu
