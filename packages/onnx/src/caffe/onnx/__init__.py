"""caffe-onnx: export a Caffe Net, with its weights, to ONNX with Caffe's exact semantics.

    import caffe, caffe.onnx
    net = caffe.Net("deploy.prototxt", caffe.TEST, weights="weights.caffemodel")
    caffe.onnx.export(net, "net.onnx")            # or opset=..., batch=N, dynamic_batch=True

Every layer type with an ONNX equivalent maps to it (`supported_layer_types()`); a net with layers that
have none (data, loss, Python layers, ...) raises UnsupportedLayersError naming all of them at once.
"""
from caffe.onnx.builder import ExportError
from caffe.onnx.exporter import DEFAULT_OPSET, UnsupportedLayersError, check_net_param, export, save, to_onnx
from caffe.onnx.registry import supported_layer_types

__all__ = ["export", "to_onnx", "save", "check_net_param", "ExportError", "UnsupportedLayersError",
           "supported_layer_types", "DEFAULT_OPSET"]
