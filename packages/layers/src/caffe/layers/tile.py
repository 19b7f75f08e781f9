"""Tile: repeat the bottom `tiles` times along `axis` (the whole block from axis on is repeated)."""
from caffe.layers.layer import Layer
from caffe.layers.registry import register_layer


@register_layer("Tile")
class TileLayer(Layer):
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def reshape(self, bottom, top):
        p = self.layer_param.tile_param
        x = bottom[0]
        try:
            self.axis = x.canonical_axis_index(p.axis)
        except IndexError:
            raise self.error(f"tile_param.axis {p.axis} is out of range for bottom[0] with shape {x.shape}") from None
        self.check(p.HasField("tiles"), "Number of tiles must be specified (tile_param.tiles)")
        if p.tiles <= 0:
            raise self.error(f"Number of tiles must be positive, got tile_param.tiles {p.tiles}")
        self.tiles = p.tiles
        shape = list(x.shape)
        shape[self.axis] *= self.tiles
        self.outer, self.inner = x.count(0, self.axis), x.count(self.axis)
        top[0].reshape(shape)

    def forward_xp(self, xp, bottom, top):
        x = bottom[0].data_xp(xp).reshape(self.outer, 1, self.inner)
        y = xp.broadcast_to(x, (self.outer, self.tiles, self.inner))
        top[0].mutable_data_xp(xp)[...] = y.reshape(top[0].shape)

    def backward_xp(self, xp, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dy = top[0].diff_xp(xp).reshape(self.outer, self.tiles, self.inner)
        bottom[0].mutable_diff_xp(xp)[...] = dy.sum(axis=1).reshape(bottom[0].shape)
