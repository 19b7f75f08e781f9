"""caffe.net: Caffe's Net (and pycaffe's Net surface), the legacy-format upgrades, weights I/O,
pycaffe's caffe.io helpers and Classifier.

`caffe.Net`, `caffe.Classifier` and `caffe.io` resolve here lazily from the top-level package.
"""
import importlib as _importlib

from caffe.net.graph import FilterNet, InsertSplits, NetError, StateMeetsRule
from caffe.net.protofile import ProtoFileError
from caffe.net.net import Net, TRAIN, TEST
from caffe.net.weights import WeightsError
from caffe.net import upgrade
from caffe.net.classifier import Classifier

# RNN/LSTM layers build unrolled nets, so they live here; the module may not exist yet.
try:
    recurrent = _importlib.import_module("caffe.net.recurrent")
except ImportError as _e:
    if _e.name != "caffe.net.recurrent":
        raise

__all__ = ["Net", "Classifier", "NetError", "WeightsError", "ProtoFileError", "FilterNet", "InsertSplits",
           "StateMeetsRule", "upgrade", "TRAIN", "TEST"]
