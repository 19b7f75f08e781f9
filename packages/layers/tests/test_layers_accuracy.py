"""Accuracy: top_k, axis, ignore_label, per-class second top, Caffe's tie rule, bad input."""
import numpy as np
import pytest
from hypothesis import example, given, strategies as st

from caffe.layers import LayerError
from caffe.layers.strategies import seeds, shapes
from caffe.layers.testing import make_layer, run_forward


def accuracy_reference(x, labels, axis, top_k, ignore):
    """By sorting: correct when at most top_k scores (the true class's own included) are >= the true
    class's score, i.e. ties count against the true class as in Caffe."""
    c = x.shape[axis]
    scores = np.moveaxis(x, axis, -1).reshape(-1, c)
    lab = labels.reshape(-1).astype(int)
    hits, total = 0, 0
    per_hits, per_total = np.zeros(c), np.zeros(c)
    for s, l in zip(scores, lab):
        if ignore is not None and l == ignore:
            continue
        ascending = np.sort(s)
        n_ge = c - np.searchsorted(ascending, s[l], side="left")  # scores >= s[l]
        ok = n_ge <= top_k
        hits += ok
        total += 1
        per_hits[l] += ok
        per_total[l] += 1
    acc = hits / total if total else 0.0
    per = np.where(per_total == 0, 0.0, per_hits / np.maximum(per_total, 1))
    return acc, per


@st.composite
def accuracy_case(draw):
    shape = draw(shapes(min_dims=2, max_dims=4, max_side=4))
    axis = draw(st.integers(1, len(shape) - 1), label="axis")
    c = shape[axis]
    top_k = draw(st.integers(1, c), label="top_k")
    # ignore_label: none, a class (the first, the last) or a value outside [0, C) (-1, 255 as segmentation
    # nets use): ignored positions change both the accuracy's and each class's denominator
    ignore = draw(st.sampled_from([None, 0, c - 1, -1, 255]), label="ignore")
    return shape, axis, top_k, ignore, draw(seeds()), draw(st.booleans(), label="ties")


# Per-class accuracy with ignored positions, pinned: class 0 both hit and missed while -1 / 255 / a middle
# class are ignored (a denominator that counts ignored positions shows in class 0), with top_k 1 and 2.
@given(case=accuracy_case())
@example(case=((6, 3), 1, 1, -1, 31, False))
@example(case=((5, 4, 2), 1, 2, 255, 32, True))
@example(case=((4, 3, 3), 1, 1, 1, 33, False))
@example(case=((2, 3, 4), 2, 3, 3, 34, True))
def test_accuracy_matches_reference(case):
    shape, axis, top_k, ignore, seed, ties = case
    c = shape[axis]
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 3, shape).astype(float) if ties else rng.uniform(-1, 1, shape)
    label_shape = shape[:axis] + shape[axis + 1:]
    labels = rng.integers(0, c, label_shape).astype(float)
    if ignore is not None:  # about a third of the positions ignored, whatever the ignore value
        labels[rng.uniform(size=label_shape) < 1 / 3] = ignore
    text = f"accuracy_param {{ top_k: {top_k} axis: {axis} {'' if ignore is None else f'ignore_label: {ignore}'} }}"
    _, top = run_forward(make_layer("Accuracy", text), [x, labels], n_top=2)
    acc, per = accuracy_reference(x, labels, axis, top_k, ignore)
    assert top[0].shape == () and top[1].shape == (c,)
    np.testing.assert_allclose(top[0].data, acc, rtol=1e-12)
    np.testing.assert_allclose(top[1].data, per, rtol=1e-12)


def test_accuracy_per_class_ignores_ignored_positions():
    # class 0: one hit, one miss; two positions ignored (-1): class 0's accuracy is 1/2, not 1/4
    x = np.array([[0.9, 0.1], [0.1, 0.9], [0.9, 0.1], [0.9, 0.1], [0.1, 0.9]])
    labels = np.array([0.0, 0.0, -1.0, -1.0, 1.0])
    _, top = run_forward(make_layer("Accuracy", "accuracy_param { ignore_label: -1 }"), [x, labels], n_top=2)
    assert float(top[0].data) == pytest.approx(2 / 3)
    np.testing.assert_allclose(top[1].data, [0.5, 1.0])


def test_accuracy_top_k_small_example():
    x = np.array([[0.1, 0.5, 0.3, 0.05],    # label 2: second best
                  [0.7, 0.1, 0.1, 0.1],     # label 0: best
                  [0.2, 0.2, 0.3, 0.3],     # label 1: tied third (ties count against it)
                  [0.4, 0.1, 0.3, 0.2]])    # label 3: third
    labels = np.array([2.0, 0.0, 1.0, 3.0])
    expect = {1: 0.25, 2: 0.5, 3: 0.75, 4: 1.0}
    for k, acc in expect.items():
        _, top = run_forward(make_layer("Accuracy", f"accuracy_param {{ top_k: {k} }}"), [x, labels], n_top=2)
        assert float(top[0].data) == acc
    _, top = run_forward(make_layer("Accuracy", "accuracy_param { top_k: 2 }"), [x, labels], n_top=2)
    np.testing.assert_array_equal(top[1].data, [1.0, 0.0, 1.0, 0.0])


def test_accuracy_ignore_label_and_all_ignored():
    x = np.array([[0.9, 0.1], [0.9, 0.1], [0.2, 0.8]])
    _, top = run_forward(make_layer("Accuracy", "accuracy_param { ignore_label: 1 }"), [x, np.array([0.0, 1.0, 1.0])])
    assert float(top[0].data) == 1.0
    _, top = run_forward(make_layer("Accuracy", "accuracy_param { ignore_label: 1 }"), [x, np.ones(3)], n_top=2)
    assert float(top[0].data) == 0.0
    np.testing.assert_array_equal(top[1].data, [0.0, 0.0])


def test_accuracy_has_no_loss_and_no_backward():
    layer = make_layer("Accuracy", name="acc")
    bottom, top = run_forward(layer, [np.eye(2), np.array([0.0, 1.0])])
    assert layer.loss(0) == 0
    layer.Backward(top, [False, False], bottom)
    with pytest.raises(LayerError, match=r"'acc' \(Accuracy\): backward is not implemented"):
        layer.Backward(top, [True, False], bottom)


def test_accuracy_labels_need_only_the_right_count():
    # Caffe reads the labels as outer x inner values whatever their shape: a flat label blob works
    rng = np.random.default_rng(4)
    x = rng.uniform(size=(2, 3, 2))
    labels = rng.integers(0, 3, size=4).astype(float)
    _, top = run_forward(make_layer("Accuracy", "accuracy_param { axis: 1 }"), [x, labels], n_top=2)
    acc, per = accuracy_reference(x, labels.reshape(2, 2), 1, 1, None)
    np.testing.assert_allclose(top[0].data, acc)
    np.testing.assert_allclose(top[1].data, per)


def test_accuracy_bad_input():
    with pytest.raises(LayerError, match=r"'acc' \(Accuracy\): accuracy_param.top_k \(3\) must be less than or equal "
                                         r"to the number of classes \(2\)"):
        run_forward(make_layer("Accuracy", "accuracy_param { top_k: 3 }", name="acc"), [np.eye(2), np.zeros(2)])
    with pytest.raises(LayerError, match=r"number of labels must match number of predictions: bottom\[0\] "
                                         r"\(2, 3, 2\) with axis 1 needs 4 labels, but bottom\[1\] \(2,\) holds 2"):
        run_forward(make_layer("Accuracy"), [np.zeros((2, 3, 2)), np.zeros(2)])
    with pytest.raises(LayerError, match=r"accuracy_param.top_k must be >= 1, got 0"):
        run_forward(make_layer("Accuracy", "accuracy_param { top_k: 0 }"), [np.eye(2), np.zeros(2)])
    with pytest.raises(LayerError, match=r"number of classes \(6\)"):
        run_forward(make_layer("Accuracy"), [np.zeros((2, 3)), np.zeros(0)])
    with pytest.raises(LayerError, match=r"label value 2 is out of range.*\[0, 2\)"):
        run_forward(make_layer("Accuracy"), [np.eye(2), np.array([0.0, 2.0])])
    with pytest.raises(LayerError, match="accuracy_param.axis = 2 is out of range"):
        run_forward(make_layer("Accuracy", "accuracy_param { axis: 2 }"), [np.eye(2), np.zeros(1)])
