"""Input: tops whose shapes come from input_param.shape; data is filled from outside (net inputs)."""
from caffe.layers.layer import Layer
from caffe.layers.registry import register_layer


@register_layer("Input")
class InputLayer(Layer):
    exact_num_bottom_blobs = 0
    min_top_blobs = 1

    def layer_setup(self, bottom, top):
        shapes = self.layer_param.input_param.shape
        n = len(shapes)
        if n not in (0, 1, len(top)):
            raise self.error(f"input_param must give 0, 1 or one shape per top "
                             f"({len(top)} tops), got {n} shapes")
        for i, t in enumerate(top):
            if n:
                t.reshape(list(shapes[0 if n == 1 else i].dim))

    def reshape(self, bottom, top):
        pass  # tops keep whatever shape the user gave them

    def forward_xp(self, xp, bottom, top):
        pass

    def backward_xp(self, xp, top, propagate_down, bottom):
        pass
