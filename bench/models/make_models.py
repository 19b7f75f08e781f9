"""Write the deploy prototxts that bench/bench_infer.py times, from the published architectures.

    python bench/models/make_models.py        # (re)writes bench/models/*_deploy.prototxt

- resnet50_deploy.prototxt: ResNet-50 (He et al. 2015, "Deep Residual Learning"; the layer names and layout of
  the authors' Caffe release): 7x7/2 conv, 3x3/2 max pool, bottleneck stages [3, 4, 6, 3] with a projection
  shortcut first (stride 2 on the 1x1 branch2a and branch1 convolutions), BatchNorm + Scale after every
  convolution (bias_term false), global 7x7 average pool, fc1000, softmax. Input 1x3x224x224.
- googlenet_deploy.prototxt: GoogLeNet (Szegedy et al. 2014; BVLC's bvlc_googlenet layout without the
  auxiliary classifiers): conv/pool/LRN stem, inception 3a-3b, 4a-4e, 5a-5b, 7x7 average pool, dropout 0.4,
  fc1000, softmax. Input 1x3x224x224.
- squeezenet1_1_deploy.prototxt: SqueezeNet v1.1 (Iandola et al.; DeepScale's v1.1 release): 3x3/2 conv 64,
  fire modules 2-9 with max pools after conv1, fire3 and fire5, dropout 0.5, conv10 1x1 1000, global average
  pool, softmax. Input 1x3x227x227.
- mobilenet_v1_deploy.prototxt: MobileNet v1 1.0-224 (Howard et al. 2017): 3x3/2 conv 32, 13 depthwise
  separable blocks (depthwise = Convolution with group == channels), each convolution followed by
  BatchNorm + Scale + ReLU, global average pool, fc7 as a 1x1 convolution, softmax. Input 1x3x224x224.
- mobilenet_v2_deploy.prototxt: MobileNet v2 1.0-224 (Sandler et al. 2018): inverted residual blocks
  (t, c, n, s) = (1,16,1,1) (6,24,2,2) (6,32,3,2) (6,64,4,2) (6,96,3,1) (6,160,3,2) (6,320,1,1), a 1x1 conv
  1280, global average pool, 1x1 conv 1000, softmax. ReLU6, which Caffe lacks, is the Clip layer
  (min 0, max 6); the projection convolutions are linear (no activation); Eltwise SUM where the stride is 1
  and the channels match. Input 1x3x224x224.

Layers carry no weights or fillers: the benchmark fills them with seeded random values.
"""
from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent


class Proto:
    def __init__(self, name, shape):
        dims = " ".join(f"dim: {d}" for d in shape)
        self.lines = [f'name: "{name}"', 'layer {\n  name: "data"\n  type: "Input"\n  top: "data"\n'
                      f'  input_param {{ shape {{ {dims} }} }}\n}}']

    def layer(self, name, type_, bottom, top, body=""):
        bottoms = [bottom] if isinstance(bottom, str) else list(bottom)
        text = [f'layer {{\n  name: "{name}"\n  type: "{type_}"']
        text += [f'  bottom: "{b}"' for b in bottoms]
        text.append(f'  top: "{top}"')
        if body:
            text.append(f"  {body}")
        self.lines.append("\n".join(text) + "\n}")
        return top

    def conv(self, name, bottom, num_output, kernel, stride=1, pad=0, group=1, bias=True, top=None):
        body = f"convolution_param {{ num_output: {num_output} kernel_size: {kernel}"
        if pad:
            body += f" pad: {pad}"
        if stride != 1:
            body += f" stride: {stride}"
        if group != 1:
            body += f" group: {group}"
        if not bias:
            body += " bias_term: false"
        return self.layer(name, "Convolution", bottom, top or name, body + " }")

    def bn_scale(self, bn, scale, blob):
        self.layer(bn, "BatchNorm", blob, blob, "batch_norm_param { use_global_stats: true }")
        self.layer(scale, "Scale", blob, blob, "scale_param { bias_term: true }")
        return blob

    def relu(self, name, blob):
        return self.layer(name, "ReLU", blob, blob)

    def relu6(self, name, blob):
        return self.layer(name, "Clip", blob, blob, "clip_param { min: 0 max: 6 }")

    def pool(self, name, bottom, method, kernel=None, stride=1, pad=0, global_pooling=False, top=None):
        body = f"pooling_param {{ pool: {method}"
        if global_pooling:
            body += " global_pooling: true"
        else:
            body += f" kernel_size: {kernel} stride: {stride}"
            if pad:
                body += f" pad: {pad}"
        return self.layer(name, "Pooling", bottom, top or name, body + " }")

    def text(self):
        return "\n".join(self.lines) + "\n"


def resnet50():
    p = Proto("ResNet-50", (1, 3, 224, 224))
    x = p.conv("conv1", "data", 64, 7, stride=2, pad=3, bias=False)
    p.bn_scale("bn_conv1", "scale_conv1", x)
    p.relu("conv1_relu", x)
    x = p.pool("pool1", x, "MAX", 3, 2)
    for stage, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512)), start=2):
        for b in range(blocks):
            name = f"{stage}{chr(ord('a') + b)}"
            stride = 2 if b == 0 and stage > 2 else 1
            if b == 0:
                shortcut = p.conv(f"res{name}_branch1", x, width * 4, 1, stride=stride, bias=False)
                p.bn_scale(f"bn{name}_branch1", f"scale{name}_branch1", shortcut)
            else:
                shortcut = x
            y = x
            for part, (k, out, s) in zip("abc", ((1, width, stride), (3, width, 1), (1, width * 4, 1))):
                y = p.conv(f"res{name}_branch2{part}", y, out, k, stride=s, pad=k // 2, bias=False)
                p.bn_scale(f"bn{name}_branch2{part}", f"scale{name}_branch2{part}", y)
                if part != "c":
                    p.relu(f"res{name}_branch2{part}_relu", y)
            x = p.layer(f"res{name}", "Eltwise", [shortcut, y], f"res{name}")
            p.relu(f"res{name}_relu", x)
    x = p.pool("pool5", x, "AVE", 7, 1)
    x = p.layer("fc1000", "InnerProduct", x, "fc1000", "inner_product_param { num_output: 1000 }")
    p.layer("prob", "Softmax", x, "prob")
    return p.text()


def googlenet():
    p = Proto("GoogleNet", (1, 3, 224, 224))
    x = p.conv("conv1/7x7_s2", "data", 64, 7, stride=2, pad=3)
    p.relu("conv1/relu_7x7", x)
    x = p.pool("pool1/3x3_s2", x, "MAX", 3, 2)
    x = p.layer("pool1/norm1", "LRN", x, "pool1/norm1", "lrn_param { local_size: 5 alpha: 0.0001 beta: 0.75 }")
    x = p.conv("conv2/3x3_reduce", x, 64, 1)
    p.relu("conv2/relu_3x3_reduce", x)
    x = p.conv("conv2/3x3", x, 192, 3, pad=1)
    p.relu("conv2/relu_3x3", x)
    x = p.layer("conv2/norm2", "LRN", x, "conv2/norm2", "lrn_param { local_size: 5 alpha: 0.0001 beta: 0.75 }")
    x = p.pool("pool2/3x3_s2", x, "MAX", 3, 2)

    def inception(name, x, c1, c3r, c3, c5r, c5, cp):
        outs = []
        b = p.conv(f"{name}/1x1", x, c1, 1)
        outs.append(p.relu(f"{name}/relu_1x1", b))
        b = p.conv(f"{name}/3x3_reduce", x, c3r, 1)
        p.relu(f"{name}/relu_3x3_reduce", b)
        b = p.conv(f"{name}/3x3", b, c3, 3, pad=1)
        outs.append(p.relu(f"{name}/relu_3x3", b))
        b = p.conv(f"{name}/5x5_reduce", x, c5r, 1)
        p.relu(f"{name}/relu_5x5_reduce", b)
        b = p.conv(f"{name}/5x5", b, c5, 5, pad=2)
        outs.append(p.relu(f"{name}/relu_5x5", b))
        b = p.pool(f"{name}/pool", x, "MAX", 3, 1, pad=1)
        b = p.conv(f"{name}/pool_proj", b, cp, 1)
        outs.append(p.relu(f"{name}/relu_pool_proj", b))
        return p.layer(f"{name}/output", "Concat", outs, f"{name}/output")

    x = inception("inception_3a", x, 64, 96, 128, 16, 32, 32)
    x = inception("inception_3b", x, 128, 128, 192, 32, 96, 64)
    x = p.pool("pool3/3x3_s2", x, "MAX", 3, 2)
    for name, cfg in (("4a", (192, 96, 208, 16, 48, 64)), ("4b", (160, 112, 224, 24, 64, 64)),
                      ("4c", (128, 128, 256, 24, 64, 64)), ("4d", (112, 144, 288, 32, 64, 64)),
                      ("4e", (256, 160, 320, 32, 128, 128))):
        x = inception(f"inception_{name}", x, *cfg)
    x = p.pool("pool4/3x3_s2", x, "MAX", 3, 2)
    x = inception("inception_5a", x, 256, 160, 320, 32, 128, 128)
    x = inception("inception_5b", x, 384, 192, 384, 48, 128, 128)
    x = p.pool("pool5/7x7_s1", x, "AVE", 7, 1)
    p.layer("pool5/drop_7x7_s1", "Dropout", x, x, "dropout_param { dropout_ratio: 0.4 }")
    x = p.layer("loss3/classifier", "InnerProduct", x, "loss3/classifier", "inner_product_param { num_output: 1000 }")
    p.layer("prob", "Softmax", x, "prob")
    return p.text()


def squeezenet11():
    p = Proto("SqueezeNet_v1.1", (1, 3, 227, 227))
    x = p.conv("conv1", "data", 64, 3, stride=2)
    p.relu("relu_conv1", x)
    x = p.pool("pool1", x, "MAX", 3, 2)

    def fire(n, x, squeeze, expand):
        s = p.conv(f"fire{n}/squeeze1x1", x, squeeze, 1)
        p.relu(f"fire{n}/relu_squeeze1x1", s)
        a = p.conv(f"fire{n}/expand1x1", s, expand, 1)
        p.relu(f"fire{n}/relu_expand1x1", a)
        b = p.conv(f"fire{n}/expand3x3", s, expand, 3, pad=1)
        p.relu(f"fire{n}/relu_expand3x3", b)
        return p.layer(f"fire{n}/concat", "Concat", [a, b], f"fire{n}/concat")

    x = fire(2, x, 16, 64)
    x = fire(3, x, 16, 64)
    x = p.pool("pool3", x, "MAX", 3, 2)
    x = fire(4, x, 32, 128)
    x = fire(5, x, 32, 128)
    x = p.pool("pool5", x, "MAX", 3, 2)
    for n, (s, e) in zip(range(6, 10), ((48, 192), (48, 192), (64, 256), (64, 256))):
        x = fire(n, x, s, e)
    p.layer("drop9", "Dropout", x, x, "dropout_param { dropout_ratio: 0.5 }")
    x = p.conv("conv10", x, 1000, 1)
    p.relu("relu_conv10", x)
    x = p.pool("pool10", x, "AVE", global_pooling=True)
    p.layer("prob", "Softmax", x, "prob")
    return p.text()


def mobilenet_v1():
    p = Proto("MobileNet", (1, 3, 224, 224))
    x = p.conv("conv1", "data", 32, 3, stride=2, pad=1, bias=False)
    p.bn_scale("conv1/bn", "conv1/scale", x)
    p.relu("relu1", x)
    channels = 32
    blocks = [("2_1", 64, 1), ("2_2", 128, 2), ("3_1", 128, 1), ("3_2", 256, 2), ("4_1", 256, 1),
              ("4_2", 512, 2)] + [(f"5_{i}", 512, 1) for i in range(1, 6)] + [("5_6", 1024, 2), ("6", 1024, 1)]
    for name, out, stride in blocks:
        x = p.conv(f"conv{name}/dw", x, channels, 3, stride=stride, pad=1, group=channels, bias=False)
        p.bn_scale(f"conv{name}/dw/bn", f"conv{name}/dw/scale", x)
        p.relu(f"relu{name}/dw", x)
        x = p.conv(f"conv{name}/sep", x, out, 1, bias=False)
        p.bn_scale(f"conv{name}/sep/bn", f"conv{name}/sep/scale", x)
        p.relu(f"relu{name}/sep", x)
        channels = out
    x = p.pool("pool6", x, "AVE", global_pooling=True)
    x = p.conv("fc7", x, 1000, 1)
    p.layer("prob", "Softmax", x, "prob")
    return p.text()


def mobilenet_v2():
    p = Proto("MobileNet-v2", (1, 3, 224, 224))
    x = p.conv("conv1", "data", 32, 3, stride=2, pad=1, bias=False)
    p.bn_scale("conv1/bn", "conv1/scale", x)
    p.relu6("relu1", x)
    channels = 32
    block = 0
    for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                       (6, 160, 3, 2), (6, 320, 1, 1)):
        for i in range(n):
            block += 1
            stride = s if i == 0 else 1
            name = f"conv{block + 1}"
            y = x
            hidden = channels * t
            if t != 1:
                y = p.conv(f"{name}/expand", y, hidden, 1, bias=False)
                p.bn_scale(f"{name}/expand/bn", f"{name}/expand/scale", y)
                p.relu6(f"relu{block + 1}/expand", y)
            y = p.conv(f"{name}/dwise", y, hidden, 3, stride=stride, pad=1, group=hidden, bias=False)
            p.bn_scale(f"{name}/dwise/bn", f"{name}/dwise/scale", y)
            p.relu6(f"relu{block + 1}/dwise", y)
            y = p.conv(f"{name}/linear", y, c, 1, bias=False)
            p.bn_scale(f"{name}/linear/bn", f"{name}/linear/scale", y)
            if stride == 1 and channels == c:
                y = p.layer(f"block_{block + 1}", "Eltwise", [x, y], f"block_{block + 1}")
            x = y
            channels = c
    x = p.conv("conv_last", x, 1280, 1, bias=False)
    p.bn_scale("conv_last/bn", "conv_last/scale", x)
    p.relu6("relu_last", x)
    x = p.pool("pool_last", x, "AVE", global_pooling=True)
    x = p.conv("fc", x, 1000, 1)
    p.layer("prob", "Softmax", x, "prob")
    return p.text()


MODELS = {
    "resnet50": resnet50,
    "googlenet": googlenet,
    "squeezenet1_1": squeezenet11,
    "mobilenet_v1": mobilenet_v1,
    "mobilenet_v2": mobilenet_v2,
}


def main() -> None:
    for name, make in MODELS.items():
        path = HERE / f"{name}_deploy.prototxt"
        path.write_text(f"# {name}: written by bench/models/make_models.py from the published architecture "
                        f"(see that file).\n" + make())
        print(path)


if __name__ == "__main__":
    main()
