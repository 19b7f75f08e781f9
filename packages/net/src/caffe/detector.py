"""pycaffe's caffe.Detector: classify windows (crops) of images in one batched pass, R-CNN style.

    det = caffe.Detector(deploy, weights, mean=..., raw_scale=255, channel_swap=(2, 1, 0), context_pad=16)
    dets = det.detect_windows([("img.jpg", [(ymin, xmin, ymax, xmax), ...])])
    # -> [{'filename': 'img.jpg', 'window': ..., 'prediction': scores}, ...]

Each window is cut out (with `context_pad` pixels of surrounding context, scaled as R-CNN does, the part
outside the image filled with the mean), warped to the net's input size, preprocessed by a
caffe.io.Transformer and run through the net. Selective-search proposals come from an external tool
(selective_search_ijcv_with_python, which runs MATLAB): detect_selective_search says so when it is absent.
"""
from __future__ import annotations

import os

import numpy as np

from caffe.net import io as caffe_io
from caffe.net.classifier import input_transformer
from caffe.net.net import TEST, Net


class Detector(Net):
    """Detector(model_file, pretrained_file, mean=None, input_scale=None, raw_scale=None, channel_swap=None,
    context_pad=None): a TEST-phase Net over windows of images."""

    def __init__(self, model_file, pretrained_file, mean=None, input_scale=None, raw_scale=None,
                 channel_swap=None, context_pad=None):
        super().__init__(model_file, TEST, weights=pretrained_file)
        self.transformer = input_transformer(self, mean, input_scale, raw_scale, channel_swap)
        self.configure_crop(context_pad)

    def detect_windows(self, images_windows):
        """[(image filename, [window, ...]), ...] -> one {'window', 'prediction', 'filename'} dict per window,
        in order; windows are (ymin, xmin, ymax, xmax) pixel boxes."""
        images_windows = [(fname, list(windows)) for fname, windows in images_windows]
        crops = []
        for fname, windows in images_windows:
            image = caffe_io.load_image(fname).astype(np.float32)
            crops.extend(self.crop(image, window) for window in windows)
        if not crops:
            return []
        in_ = self.inputs[0]
        caffe_in = np.zeros((len(crops), crops[0].shape[2]) + tuple(self.blobs[in_].data.shape[2:]),
                            dtype=np.float32)
        for ix, window_in in enumerate(crops):
            caffe_in[ix] = self.transformer.preprocess(in_, window_in)
        predictions = self.forward_all(**{in_: caffe_in})[self.outputs[0]]
        detections, ix = [], 0
        for fname, windows in images_windows:
            for window in windows:
                detections.append({"window": window, "prediction": predictions[ix], "filename": fname})
                ix += 1
        return detections

    def detect_selective_search(self, image_fnames):
        """detect_windows over the Selective Search proposals of each image (needs the external
        selective_search_ijcv_with_python package and MATLAB)."""
        try:
            import selective_search_ijcv_with_python as selective_search
        except ImportError:
            raise RuntimeError("detect_selective_search needs the selective_search_ijcv_with_python package "
                               "(github.com/sergeyk/selective_search_ijcv_with_python, which runs MATLAB) on "
                               "the Python path; or compute windows yourself and call detect_windows") from None
        image_fnames = [os.path.abspath(f) for f in image_fnames]  # MATLAB runs elsewhere
        windows_list = selective_search.get_windows(image_fnames, cmd="selective_search_rcnn")
        return self.detect_windows(zip(image_fnames, windows_list))

    def crop(self, im, window):
        """The window (ymin, xmin, ymax, xmax) of an H x W x K image; with context_pad, a crop_dims image
        holding the window grown by the context margin (as R-CNN warps it), mean-filled outside the image."""
        window = np.asarray(window)
        if window.shape != (4,):
            raise ValueError(f"a window is (ymin, xmin, ymax, xmax), got {window.tolist()}")
        y0, x0, y1, x1 = (int(v) for v in window)
        if not self.context_pad:
            return im[y0:y1, x0:x1]
        crop_size = self.blobs[self.inputs[0]].width  # a square input
        scale = crop_size / (1.0 * crop_size - self.context_pad * 2)
        # grow the box about its center so that, warped, the margin is context_pad pixels
        half_h, half_w = (y1 - y0 + 1) / 2.0, (x1 - x0 + 1) / 2.0
        center = np.array((y0 + half_h, x0 + half_w))
        box = np.round(np.tile(center, 2) + scale * np.array((-half_h, -half_w, half_h, half_w)))
        scale_h = crop_size / (box[2] - box[0] + 1)
        scale_w = crop_size / (box[3] - box[1] + 1)
        pad_y = int(round(max(0.0, -box[0]) * scale_h))  # how much of the grown box is off the image
        pad_x = int(round(max(0.0, -box[1]) * scale_w))
        im_h, im_w = im.shape[:2]
        box = np.clip(box, 0.0, [im_h, im_w, im_h, im_w])
        clip_h, clip_w = box[2] - box[0] + 1, box[3] - box[1] + 1
        if clip_h <= 0 or clip_w <= 0:
            raise ValueError(f"window {window.tolist()} lies outside the {im_h}x{im_w} image")
        crop_h = min(int(round(clip_h * scale_h)), crop_size - pad_y)
        crop_w = min(int(round(clip_w * scale_w)), crop_size - pad_x)
        context = im[int(box[0]):int(box[2]), int(box[1]):int(box[3])]
        out = np.ones(self.crop_dims, dtype=np.float32) * self.crop_mean
        out[pad_y:pad_y + crop_h, pad_x:pad_x + crop_w] = caffe_io.resize_image(context, (crop_h, crop_w))
        return out

    def configure_crop(self, context_pad):
        """Crop dimensions (the net input as H x W x K) and, with context, the mean in raw image space
        (untransposed, channels unswapped, divided by raw_scale) that fills context outside the image."""
        in_ = self.inputs[0]
        tpose = self.transformer.transpose[in_]
        inv_tpose = [tpose[t] for t in tpose]
        self.crop_dims = np.array(self.blobs[in_].data.shape[1:])[inv_tpose]
        self.context_pad = context_pad
        if not self.context_pad:
            return
        mean = self.transformer.mean.get(in_)
        if mean is None:
            self.crop_mean = np.zeros(self.crop_dims, dtype=np.float32)
            return
        mean = mean.reshape((1,) + mean.shape) if mean.ndim == 2 else mean  # a one-channel H x W mean
        crop_mean = mean.astype(np.float32).transpose(np.argsort(tpose))
        channel_order = self.transformer.channel_swap.get(in_)
        if channel_order is not None:
            crop_mean = crop_mean[:, :, [list(channel_order).index(i) for i in range(crop_mean.shape[2])]]
        raw_scale = self.transformer.raw_scale.get(in_)
        if raw_scale is not None:
            crop_mean = crop_mean / raw_scale
        self.crop_mean = crop_mean
