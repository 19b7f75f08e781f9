"""WindowData: a tiny generated window file and images; fg/bg sampling, warp/square, context_pad, errors."""
import numpy as np
import pytest

from caffe.blob import Blob, context
from caffe.blob.proto_io import array_to_blob_proto
from caffe.layers import LayerError
from caffe.layers.testing import make_layer

Image = pytest.importorskip("PIL.Image")

# image 0 (20 wide x 16 high): fg class 2 and 3 windows, one bg window, one dropped (0.3 <= overlap < 0.5)
WINDOWS = {0: [(2, 0.9, 2, 3, 9, 10), (3, 0.7, 10, 0, 19, 7), (1, 0.1, 0, 0, 5, 5), (1, 0.3, 1, 1, 4, 4)],
           1: [(0, 0.2, 3, 3, 12, 8)]}


@pytest.fixture
def window_file(tmp_path):
    rng = np.random.default_rng(0)
    imgs = []
    lines = []
    for idx, (w, h) in enumerate([(20, 16), (14, 10)]):
        yy, xx = np.mgrid[0:h, 0:w]
        arr = np.stack([(xx * 11) % 256, (yy * 13) % 256, rng.integers(0, 256, size=(h, w))], -1).astype(np.uint8)
        Image.fromarray(arr).save(tmp_path / f"im{idx}.png")
        imgs.append(arr)
        lines += [f"# {idx}", f"im{idx}.png", "3", str(h), str(w), str(len(WINDOWS[idx]))]
        lines += [" ".join(map(str, win)) for win in WINDOWS[idx]]
    (tmp_path / "windows.txt").write_text("\n".join(lines) + "\n")
    return tmp_path, imgs


def window_layer(root, extra="", batch=8, fg=0.5, crop=6, transform="", source=None):
    source = source or root / "windows.txt"
    return make_layer("WindowData", f'window_data_param {{ source: "{source}" root_folder: "{root}/" '
                                    f'batch_size: {batch} fg_fraction: {fg} fg_threshold: 0.5 '
                                    f'bg_threshold: 0.3 {extra} }} transform_param {{ crop_size: {crop} '
                                    f'{transform} }}')


def forward(layer, n=1):
    top = [Blob(), Blob()]
    layer.SetUp([], top)
    out = []
    for _ in range(n):
        layer.Forward([], top)
        out.append((top[0].data.copy(), top[1].data.copy()))
    layer.close()
    return out


def warped(img, box, crop):
    x1, y1, x2, y2 = box
    region = Image.fromarray(img).crop((x1, y1, x2 + 1, y2 + 1)).resize((crop, crop), Image.BILINEAR)
    return np.asarray(region)[:, :, ::-1].transpose(2, 0, 1).astype(np.float32)


def test_warp_samples_bg_then_fg(window_file):
    root, imgs = window_file
    context.set_random_seed(1)
    (data, labels), = forward(window_layer(root, batch=8, fg=0.5), 1)
    assert data.shape == (8, 3, 6, 6) and labels.shape == (8,)
    assert list(labels[:4]) == [0, 0, 0, 0] and set(labels[4:]) <= {2, 3}
    cands = {0: [warped(imgs[0], (0, 0, 5, 5), 6), warped(imgs[1], (3, 3, 12, 8), 6)],
             2: [warped(imgs[0], (2, 3, 9, 10), 6)], 3: [warped(imgs[0], (10, 0, 19, 7), 6)]}
    for item, lab in zip(data, labels):
        assert any(np.array_equal(item, c) for c in cands[int(lab)])


def test_mirror_scale_and_mean_value(window_file):
    root, imgs = window_file
    context.set_random_seed(2)
    layer = window_layer(root, "scale: 0.5", batch=16, fg=1.0, transform="mirror: true mean_value: 10")
    (data, labels), = forward(layer, 1)
    plain = {2: warped(imgs[0], (2, 3, 9, 10), 6), 3: warped(imgs[0], (10, 0, 19, 7), 6)}
    flips = 0
    for item, lab in zip(data, labels):
        want = (plain[int(lab)] - 10) * np.float32(0.5)
        assert np.array_equal(item, want) or np.array_equal(item, want[..., ::-1])
        flips += not np.array_equal(item, want)
    assert 0 < flips < 16


def test_context_pad_pads_with_zeros_outside_the_image(window_file):
    """Window (0,0)-(5,5) grown by context: the part beyond the top-left corner stays 0."""
    root, imgs = window_file
    for mode in ("warp", "square"):
        layer = window_layer(root, f'context_pad: 2 crop_mode: "{mode}"', batch=4, fg=0.0, crop=10)
        (data, labels), = forward(layer, 1)
        from_img0 = [d for d in data if d[:, 0, 0].sum() == 0 and d[:, -1, -1].sum() != 0]
        assert from_img0, mode
        d = from_img0[0]
        # context_scale 10/6: the 6x6 box becomes 10x10 centred at 3 -> x1 = y1 = -2 -> 2 rows/cols of padding
        assert not d[:, :2, :].any() and not d[:, :, :2].any() and d[:, 2:, 2:].any()


def test_mean_file_is_centered(window_file, tmp_path):
    root, imgs = window_file
    mean = np.random.default_rng(3).uniform(0, 50, size=(3, 8, 8)).astype(np.float32)
    mf = tmp_path / "mean.binaryproto"
    mf.write_bytes(array_to_blob_proto(mean[None]).SerializeToString())
    (data, labels), = forward(window_layer(root, batch=2, fg=1.0, transform=f'mean_file: "{mf}"'), 1)
    for item, lab in zip(data, labels):
        box = (2, 3, 9, 10) if lab == 2 else (10, 0, 19, 7)
        np.testing.assert_array_equal(item, warped(imgs[0], box, 6) - mean[:, 1:7, 1:7])


def test_reproducible_under_seed(window_file):
    root, _ = window_file
    runs = []
    for _ in range(2):
        context.set_random_seed(9)
        runs.append(forward(window_layer(root, batch=6, transform="mirror: true"), 2))
    for (a, la), (b, lb) in zip(*runs):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(la, lb)


def test_bad_window_files(window_file):
    root, _ = window_file
    bad = root / "bad.txt"
    bad.write_text("# 0\nim0.png\n3\n16\n20\n1\n0 0.9 1 1 4 4\n")
    with pytest.raises(LayerError, match=r"'.*bad.txt' line 7: a foreground window .* needs a class index > 0"):
        window_layer(root, source=bad).SetUp([], [Blob(), Blob()])
    bad.write_text("# 0\nim0.png\n3\n16\nwide\n")
    with pytest.raises(LayerError, match=r"'.*bad.txt' line 5: expected width, got 'wide'"):
        window_layer(root, source=bad).SetUp([], [Blob(), Blob()])
    bad.write_text("")
    with pytest.raises(LayerError, match="window file '.*bad.txt' is empty"):
        window_layer(root, source=bad).SetUp([], [Blob(), Blob()])
    bad.write_text("# 0\nmissing.png\n3\n16\n20\n2\n1 0.9 1 1 4 4\n0 0.1 1 1 4 4\n")
    layer = window_layer(root, source=bad, batch=2)
    top = [Blob(), Blob()]
    layer.SetUp([], top)
    with pytest.raises(LayerError, match="could not open or find image '.*missing.png'"):
        layer.Forward([], top)
    with pytest.raises(LayerError, match="crop_size must be positive"):
        window_layer(root, crop=0).SetUp([], [Blob(), Blob()])
    with pytest.raises(LayerError, match="no foreground windows"):
        window_layer(root, fg=1.0, source=_only_bg(root)).SetUp([], [Blob(), Blob()])


def _only_bg(root):
    p = root / "bg.txt"
    p.write_text("# 0\nim0.png\n3\n16\n20\n1\n0 0.1 1 1 4 4\n")
    return p
