"""Caffe's protobuf schema (generated ``caffe_pb2``)."""
