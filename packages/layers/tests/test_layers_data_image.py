"""ImageData: list file, root_folder, color/gray, resize, shuffle, wrap-around, bad input."""
import numpy as np
import pytest

from caffe.blob import Blob, context
from caffe.layers import LayerError
from caffe.layers.testing import make_layer

Image = pytest.importorskip("PIL.Image")


@pytest.fixture
def images(tmp_path):
    rng = np.random.default_rng(0)
    arrs = [rng.integers(0, 256, size=(6, 8, 3)).astype(np.uint8) for _ in range(5)]
    (tmp_path / "img dir").mkdir()
    lines = []
    for i, a in enumerate(arrs):
        name = f"img dir/pic {i}.png"  # spaces in the path: the label follows the last one
        Image.fromarray(a).save(tmp_path / name)
        lines.append(f"{name} {i * 10}")
    (tmp_path / "list.txt").write_text("\n".join(lines) + "\n")
    return tmp_path, arrs


def image_layer(root, extra="", batch=2, phase=0, source=None):
    source = source or root / "list.txt"
    return make_layer("ImageData", f'image_data_param {{ source: "{source}" root_folder: "{root}/" '
                                   f'batch_size: {batch} {extra} }}', phase=phase)


def run(layer, n_fwd, ntop=2):
    top = [Blob() for _ in range(ntop)]
    layer.SetUp([], top)
    out = []
    for _ in range(n_fwd):
        layer.Forward([], top)
        out.append([t.data.copy() for t in top])
    layer.close()
    return out


def test_reads_in_list_order_bgr_and_wraps(images):
    root, arrs = images
    out = run(image_layer(root, batch=2), 3)
    labels = [lab for _, b in out for lab in b]
    assert labels == [0, 10, 20, 30, 40, 0]
    data = np.concatenate([d for d, _ in out])
    for i in range(6):
        np.testing.assert_array_equal(data[i], arrs[i % 5][:, :, ::-1].transpose(2, 0, 1))


def test_gray_and_resize(images):
    root, arrs = images
    (d, _), = run(image_layer(root, "is_color: false new_height: 3 new_width: 4", batch=1), 1)
    assert d.shape == (1, 1, 3, 4)
    want = np.asarray(Image.fromarray(arrs[0]).convert("L").resize((4, 3), Image.BILINEAR), np.float32)
    np.testing.assert_array_equal(d[0, 0], want)


def test_shuffle_is_a_reproducible_permutation(images):
    root, _ = images
    runs = []
    for seed in (3, 3, 4):
        context.set_random_seed(seed)
        runs.append([lab for _, b in run(image_layer(root, "shuffle: true", batch=5), 2) for lab in b])
    assert runs[0] == runs[1]
    assert sorted(runs[0][:5]) == sorted(runs[0][5:]) == [0, 10, 20, 30, 40]  # each epoch is a permutation
    assert runs[0] != runs[2] or runs[0][:5] != [0, 10, 20, 30, 40]


def test_transform_applies(images):
    root, arrs = images
    layer = image_layer(root, batch=1, phase=1)
    layer.layer_param.transform_param.crop_size = 4
    layer.layer_param.transform_param.scale = 0.5
    layer.layer_param.transform_param.mean_value.extend([1, 2, 3])
    (d, _), = run(layer, 1)
    want = (arrs[0][1:5, 2:6, ::-1].transpose(2, 0, 1).astype(np.float32)
            - np.array([1, 2, 3], np.float32)[:, None, None]) * np.float32(0.5)
    np.testing.assert_array_equal(d[0], want)


def test_missing_list_entry_names_line_and_path(images):
    root, _ = images
    lst = root / "bad.txt"
    lst.write_text("img dir/pic 0.png 0\nimg dir/missing.png 1\n")
    layer = image_layer(root, batch=2, source=lst)
    top = [Blob(), Blob()]
    layer.SetUp([], top)
    with pytest.raises(LayerError, match=r"image '.*img dir/missing.png' \(list file '.*bad.txt' line 2\): "
                                         r"no such file"):
        layer.Forward([], top)


def test_bad_lines_empty_list_and_undecodable_image(images):
    root, _ = images
    lst = root / "nolabel.txt"
    lst.write_text("img dir/pic 0.png 0\nimg dir/pic 1.png\n")
    with pytest.raises(LayerError, match=r"list file '.*nolabel.txt' line 2: expected 'path label'"):
        image_layer(root, source=lst).SetUp([], [Blob(), Blob()])
    empty = root / "empty.txt"
    empty.write_text("\n")
    with pytest.raises(LayerError, match="list file '.*empty.txt' is empty"):
        image_layer(root, source=empty).SetUp([], [Blob(), Blob()])
    (root / "junk.png").write_bytes(b"not a png")
    junk = root / "junk.txt"
    junk.write_text("junk.png 3\n")
    with pytest.raises(LayerError, match=r"image '.*junk.png' \(list file '.*junk.txt' line 1\): cannot decode"):
        image_layer(root, source=junk).SetUp([], [Blob(), Blob()])
    with pytest.raises(LayerError, match="cannot open list file '.*absent.txt'"):
        image_layer(root, source=root / "absent.txt").SetUp([], [Blob(), Blob()])
    with pytest.raises(LayerError, match="new_height and new_width must be set at the same time"):
        image_layer(root, "new_height: 3").SetUp([], [Blob(), Blob()])
