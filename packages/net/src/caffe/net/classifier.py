"""pycaffe's Classifier: a TEST-phase Net that preprocesses images and averages oversampled crops."""
from __future__ import annotations

import numpy as np

from caffe.net import io as caffe_io
from caffe.net.net import TEST, Net


def input_transformer(net, mean=None, input_scale=None, raw_scale=None, channel_swap=None):
    """The caffe.io.Transformer for net's first input, set up as pycaffe's Classifier and Detector do
    (H x W x K images in, K x H x W out; each option applied only when given)."""
    in_ = net.inputs[0]
    transformer = caffe_io.Transformer({in_: net.blobs[in_].data.shape})
    transformer.set_transpose(in_, (2, 0, 1))
    if mean is not None:
        transformer.set_mean(in_, mean)
    if input_scale is not None:
        transformer.set_input_scale(in_, input_scale)
    if raw_scale is not None:
        transformer.set_raw_scale(in_, raw_scale)
    if channel_swap is not None:
        transformer.set_channel_swap(in_, channel_swap)
    return transformer


class Classifier(Net):
    """Classifier(model_file, pretrained_file, image_dims=None, mean=None, input_scale=None,
    raw_scale=None, channel_swap=None): images (H x W x K floats) in, class scores out."""

    def __init__(self, model_file, pretrained_file, image_dims=None, mean=None, input_scale=None,
                 raw_scale=None, channel_swap=None):
        super().__init__(model_file, TEST, weights=pretrained_file)
        in_ = self.inputs[0]
        self.transformer = input_transformer(self, mean, input_scale, raw_scale, channel_swap)
        self.crop_dims = np.array(self.blobs[in_].data.shape[2:])
        self.image_dims = self.crop_dims if image_dims is None or not len(image_dims) else image_dims

    def predict(self, inputs, oversample: bool = True) -> np.ndarray:
        """Scores for each image: center crop, or the mean over 10 crops (corners, center, mirrors)."""
        image_dims = tuple(int(d) for d in self.image_dims)
        batch = np.zeros((len(inputs),) + image_dims + (inputs[0].shape[2],), dtype=np.float32)
        for i, image in enumerate(inputs):
            batch[i] = caffe_io.resize_image(image, image_dims)
        if oversample:
            batch = caffe_io.oversample(batch, self.crop_dims)
        else:
            center = np.array(image_dims) / 2.0
            crop = np.concatenate([center - self.crop_dims / 2.0, center + self.crop_dims / 2.0]).astype(int)
            batch = batch[:, crop[0]:crop[2], crop[1]:crop[3], :]
        in_ = self.inputs[0]
        caffe_in = np.zeros((batch.shape[0], batch.shape[3], batch.shape[1], batch.shape[2]), dtype=np.float32)
        for i, image in enumerate(batch):
            caffe_in[i] = self.transformer.preprocess(in_, image)
        predictions = self.forward_all(**{in_: caffe_in})[self.outputs[0]]
        if oversample:
            predictions = predictions.reshape((len(predictions) // 10, 10, -1)).mean(1)
        return predictions
