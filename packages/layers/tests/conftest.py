from caffe.blob.testing import register_hypothesis_profiles

register_hypothesis_profiles()

# A prefetching data layer's Forward fails (PrefetchStalled) when its thread burns this much CPU without
# delivering a batch (the tests' batches take milliseconds): a bug or a mutant that never moves a cursor fails
# in seconds instead of hanging the run. CPU time, not wall time: a loaded machine does not trip it.
from caffe.layers.base_data import BasePrefetchingDataLayer  # noqa: E402

BasePrefetchingDataLayer.stall_cpu_s = 5.0
