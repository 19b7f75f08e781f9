"""The GradientChecker itself: it must fail on wrong gradients, honour the kink rule, and its modes."""
import numpy as np
import pytest

from caffe.blob import Blob, context
from caffe.layers import GradientChecker, GradientCheckError
from caffe.layers.layer import Layer, NeuronLayer
from caffe.layers.testing import blobs_from_arrays, check_layer_gradient, empty_tops, layer_param


class Square(NeuronLayer):
    """y = x^2 with a configurable error in the backward pass."""
    type = "TestSquare"
    error_factor = 1.0
    error_where = None  # a predicate on x selecting where the gradient is wrong

    def forward_xp(self, xp, bottom, top):
        top[0].mutable_data_xp(xp)[...] = bottom[0].data_xp(xp) ** 2

    def backward_xp(self, xp, top, propagate_down, bottom):
        x = bottom[0].data_xp(xp)
        g = 2 * x * top[0].diff_xp(xp)
        if self.error_where is not None:
            g = np.where(self.error_where(x), g + 0.5 * top[0].diff_xp(xp), g)  # wrong on the diagonal only
        elif self.error_factor != 1.0:
            g = g * self.error_factor
        bottom[0].mutable_diff_xp(xp)[...] = g


def square(**kw):
    layer = Square(layer_param("TestSquare", name="sq"))
    for k, v in kw.items():
        setattr(layer, k, v)
    return layer


class Mix(Layer):
    """Two bottoms, one parameter: y = w * a * b (elementwise), with optional wrong gradients."""
    type = "TestMix"
    exact_num_bottom_blobs = 2
    exact_num_top_blobs = 1
    wrong_bottom = None
    wrong_param = False

    def layer_setup(self, bottom, top):
        self.blobs = [Blob(bottom[0].shape, dtype=bottom[0].dtype)]
        self.blobs[0].data[...] = np.linspace(0.5, 1.5, bottom[0].count()).reshape(bottom[0].shape)
        self.set_param_propagate_down(0, True)

    def reshape(self, bottom, top):
        top[0].reshape_like(bottom[0])

    def forward_xp(self, xp, bottom, top):
        top[0].mutable_data_xp(xp)[...] = self.blobs[0].data * bottom[0].data * bottom[1].data

    def backward_xp(self, xp, top, propagate_down, bottom):
        dy = top[0].diff
        w, a, b = self.blobs[0].data, bottom[0].data, bottom[1].data
        self.blobs[0].diff[...] += dy * a * b * (1.3 if self.wrong_param else 1.0)
        if propagate_down[0]:
            bottom[0].diff[...] = dy * w * b * (1.3 if self.wrong_bottom == 0 else 1.0)
        if propagate_down[1]:
            bottom[1].diff[...] = dy * w * a * (1.3 if self.wrong_bottom == 1 else 1.0)


def mix(**kw):
    layer = Mix(layer_param("TestMix", name="mix"))
    for k, v in kw.items():
        setattr(layer, k, v)
    return layer


X = np.array([[-1.5, -0.7, 0.3], [0.9, 1.2, 2.0]])


@pytest.mark.parametrize("mode", ["eltwise", "exhaustive", "single"])
def test_correct_layer_passes_in_every_mode(mode):
    check_layer_gradient(square(), [X], mode=mode, stepsize=1e-4, threshold=1e-6)


@pytest.mark.parametrize("mode", ["eltwise", "exhaustive", "single"])
def test_wrong_backward_fails_in_every_mode(mode):
    with pytest.raises(GradientCheckError, match=r"gradient mismatch\(es\) in layer 'sq' \(TestSquare\)"):
        check_layer_gradient(square(error_factor=1.01), [X], mode=mode, threshold=1e-3)


def test_eltwise_mode_catches_off_diagonal_gradients():
    class Leaky(Square):
        def backward_xp(self, xp, top, propagate_down, bottom):
            super().backward_xp(xp, top, propagate_down, bottom)
            bottom[0].mutable_diff_xp(xp).reshape(-1)[1] += 0.5  # whatever the top element

    # Checking top element 0: bottom element 1 claims 0.5 where top 0 does not depend on it.
    with pytest.raises(GradientCheckError, match="bottom 0 element 1 \\(top 0, element 0\\): computed 0.5, estimated 0"):
        check_layer_gradient(Leaky(layer_param("TestSquare")), [X], mode="eltwise", threshold=1e-6)


def test_threshold_is_relative_to_max_of_magnitudes_and_one():
    # 0.05 % off: within a 1e-3 threshold, outside 1e-5.
    check_layer_gradient(square(error_factor=1.0005), [X], mode="eltwise", threshold=1e-3)
    with pytest.raises(GradientCheckError):
        check_layer_gradient(square(error_factor=1.0005), [X], mode="eltwise", threshold=1e-5)


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_a_non_finite_gradient_fails(bad):
    # |inf - e| <= threshold * max(|inf|, |e|, 1) holds (Caffe's EXPECT_NEAR lets it through): not here
    class Blowup(Square):
        def backward_xp(self, xp, top, propagate_down, bottom):
            super().backward_xp(xp, top, propagate_down, bottom)
            bottom[0].mutable_diff_xp(xp).reshape(-1)[2] = bad

    with pytest.raises(GradientCheckError, match=r"bottom 0 element 2 \(top 0, element \d\): computed -?(inf|nan)"):
        check_layer_gradient(Blowup(layer_param("TestSquare")), [X], mode="eltwise", threshold=1e-6)


def test_failure_message_names_the_blob_and_element():
    bad = square(error_where=lambda x: x == X.flat[4])
    with pytest.raises(GradientCheckError) as info:
        check_layer_gradient(bad, [X], mode="eltwise", threshold=1e-6)
    assert "1 gradient mismatch(es)" in str(info.value)
    assert "bottom 0 element 4 (top 0, element 4)" in str(info.value)


def test_kink_rule_skips_elements_near_the_kink():
    near = lambda x: np.abs(np.abs(x) - 0.3) < 0.05  # noqa: E731  wrong only where |x| is near 0.3
    x = np.array([-1.5, -0.31, 0.3, 0.9, 0.28])
    kw = dict(mode="single", stepsize=1e-4, threshold=1e-6)  # single: every element in one report
    with pytest.raises(GradientCheckError, match="3 gradient mismatch"):
        check_layer_gradient(square(error_where=near), [x], **kw)
    check_layer_gradient(square(error_where=near), [x], kink=0.3, kink_range=0.05, **kw)
    with pytest.raises(GradientCheckError, match=r"2 gradient mismatch.*\n.*element 1 .*\n.*element 4 "):
        # -0.31 and 0.28 lie outside a 0.005 range around the kink; 0.3 itself is skipped
        check_layer_gradient(square(error_where=near), [x], kink=0.3, kink_range=0.005, **kw)


def test_parameter_and_bottom_selection():
    a, b = X, X[::-1].copy() + 0.1
    check_layer_gradient(mix(), [a, b], mode="exhaustive", threshold=1e-6)
    for wrong in (0, 1):
        with pytest.raises(GradientCheckError, match=f"bottom {wrong} element"):
            check_layer_gradient(mix(wrong_bottom=wrong), [a, b], mode="exhaustive", threshold=1e-6)
        # Checking only the other bottom does not see the wrong one.
        check_layer_gradient(mix(wrong_bottom=wrong), [a, b], mode="exhaustive", threshold=1e-6,
                             check_bottom=1 - wrong)
    with pytest.raises(GradientCheckError, match="param blob 0 element"):
        check_layer_gradient(mix(wrong_param=True), [a, b], mode="single", check_bottom=0, threshold=1e-6)
    with pytest.raises(GradientCheckError, match="check_bottom 2 out of range"):
        check_layer_gradient(mix(), [a, b], mode="single", check_bottom=2)


def test_eltwise_mode_refuses_layers_with_parameters():
    with pytest.raises(GradientCheckError, match="element-wise mode is for layers without parameter blobs"):
        check_layer_gradient(mix(), [X, X], mode="eltwise")


def test_checker_restores_the_bottom_data():
    bottom = blobs_from_arrays([X])
    top = empty_tops(1)
    GradientChecker(1e-3, 1e-6).check_gradient_exhaustive(square(), bottom, top)
    np.testing.assert_array_equal(bottom[0].data, X)


def test_checker_reseeds_before_every_forward():
    """A random layer is checkable because every forward sees the same draws; its own seed is used."""
    class Noisy(NeuronLayer):
        type = "TestNoisy"

        def forward_xp(self, xp, bottom, top):
            self.noise = context.rng().uniform(0.5, 1.5, bottom[0].shape)
            top[0].data[...] = bottom[0].data * self.noise

        def backward_xp(self, xp, top, propagate_down, bottom):
            bottom[0].diff[...] = top[0].diff * self.noise

    layer = Noisy(layer_param("TestNoisy"))
    check_layer_gradient(layer, [X], mode="eltwise", threshold=1e-8, seed=5)
    seen = layer.noise.copy()
    context.set_random_seed(5)
    np.testing.assert_array_equal(seen, context.rng().uniform(0.5, 1.5, X.shape))


def test_unknown_mode():
    with pytest.raises(ValueError, match="unknown gradient-check mode"):
        check_layer_gradient(square(), [X], mode="sideways")
