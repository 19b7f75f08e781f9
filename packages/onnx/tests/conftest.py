from caffe.blob.testing import register_hypothesis_profiles

register_hypothesis_profiles()
