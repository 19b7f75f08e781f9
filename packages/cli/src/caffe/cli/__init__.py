"""caffe.cli: Caffe's command-line tools (the `caffe-cli` command). See caffe.cli.main."""
