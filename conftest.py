"""Root conftest: hypothesis profiles for the whole monorepo run, and what GPU-marked tests run on
(a real GPU, the CuPy stand-in under CAFFE_CUPY_STANDIN=1, or none: see caffe.blob.testing)."""
from caffe.blob.testing import (gpu_report_header, register_hypothesis_profiles, standin_deselect,
                                standin_summary)

register_hypothesis_profiles()


def pytest_report_header(config):
    return gpu_report_header()


def pytest_collection_modifyitems(config, items):
    standin_deselect(config, items)


def pytest_terminal_summary(terminalreporter):
    standin_summary(terminalreporter)
