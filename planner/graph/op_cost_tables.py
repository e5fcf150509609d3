"""Per-element FLOP counts and data-movement classes of ONNX ops.

Kept apart from `op_costs` because these are data, not logic: a reader
checking "how many FLOPs is a Sigmoid?" finds every convention here.

Convention (the one fvcore, ptflops and the roofline literature use): one
FLOP per arithmetic operation in the op's textbook formula, a transcendental
function (exp, log, erf, tanh, sin...) counted as one, a comparison as one.
A multiply-add is 2 FLOPs. These ops are memory-bound on every accelerator we
model, so their bytes matter far more than the exact FLOP weight.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

#: FLOPs per output element of one-input elementwise ops, by formula.
UNARY_FLOPS: Mapping[str, float] = MappingProxyType(
    {
        "Abs": 1, "Neg": 1, "Relu": 1, "Sign": 1, "Floor": 1, "Ceil": 1, "Round": 1, "Not": 1,
        "Reciprocal": 1, "Sqrt": 1, "Exp": 1, "Log": 1, "Erf": 1, "Tanh": 1,
        "Sin": 1, "Cos": 1, "Tan": 1, "Asin": 1, "Acos": 1, "Atan": 1,
        "Sinh": 1, "Cosh": 1, "Asinh": 1, "Acosh": 1, "Atanh": 1,
        "IsNaN": 1, "IsInf": 1, "BitwiseNot": 1, "ThresholdedRelu": 1,
        "LeakyRelu": 2,  # compare, multiply
        "Clip": 2,  # max, min
        "Shrink": 2,
        "HardSigmoid": 3,  # max(0, min(1, a*x + b)): mul-add, clamp
        "Softsign": 3,  # x / (1 + |x|)
        "Softplus": 3,  # log(1 + exp(x))
        "Elu": 3,  # exp, sub, mul on the negative side
        "Celu": 4,
        "Selu": 4,
        "Sigmoid": 4,  # 1 / (1 + exp(-x)): neg, exp, add, div
        "HardSwish": 4,  # x * hardsigmoid(x)
        "Swish": 5,  # x * sigmoid(alpha x)
        "Mish": 5,  # x * tanh(softplus(x))
        "Gelu": 5,  # 0.5 x (1 + erf(x / sqrt 2)); the tanh approximation is 9, see GELU_TANH_FLOPS
        "Dropout": 1,  # the mask multiply (identity at inference)
        "Trilu": 0,  # a masked copy
        "Cast": 0,  # a conversion, no arithmetic
        "CastLike": 0,
        "Bernoulli": 1,
        "QuantizeLinear": 2,  # divide by scale, add zero point (then round/saturate)
        "DequantizeLinear": 2,
        "DynamicQuantizeLinear": 4,
        "CumSum": 1,
        "Hardmax": 1,
    }
)

#: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (Hendrycks & Gimpel 2016, eq. 2).
GELU_TANH_FLOPS = 9

#: FLOPs per output element and per extra operand of broadcasting / variadic ops.
NARY_FLOPS: Mapping[str, float] = MappingProxyType(
    {
        "Add": 1, "Sub": 1, "Mul": 1, "Div": 1, "Pow": 1, "Mod": 1,
        "Max": 1, "Min": 1, "Sum": 1, "Mean": 1,
        "Equal": 1, "Less": 1, "Greater": 1, "LessOrEqual": 1, "GreaterOrEqual": 1,
        "And": 1, "Or": 1, "Xor": 1, "BitShift": 1,
        "BitwiseAnd": 1, "BitwiseOr": 1, "BitwiseXor": 1,
        "Where": 1, "PRelu": 2,
    }
)

#: Normalisations: FLOPs per element of the normalised input.
#: LayerNorm: mean (1), centre (1), square (1), sum (1), scale by 1/std (1),
#: gamma (1), beta (1) = 7, 8 with the variance's own divide folded per row (Ba et al. 2016).
#: RMSNorm: square, sum, scale by 1/rms, gamma = 4 (Zhang & Sennrich 2019, eq. 4).
NORM_FLOPS: Mapping[str, float] = MappingProxyType(
    {
        "LayerNormalization": 8,
        "GroupNormalization": 8,
        "InstanceNormalization": 8,
        "MeanVarianceNormalization": 7,
        "RMSNormalization": 4,
        "LpNormalization": 3,
        "SimplifiedLayerNormalization": 4,  # com.microsoft: RMSNorm
        "SkipLayerNormalization": 9,  # com.microsoft: residual add + LayerNorm
        "SkipSimplifiedLayerNormalization": 5,  # com.microsoft: residual add + RMSNorm
        "Softmax": 5,  # max, subtract, exp, sum, divide (per element)
        "LogSoftmax": 5,
    }
)

#: Reductions: FLOPs per INPUT element (plus per-output extras in `REDUCE_OUT_FLOPS`).
REDUCE_IN_FLOPS: Mapping[str, float] = MappingProxyType(
    {
        "ReduceSum": 1, "ReduceMean": 1, "ReduceMax": 1, "ReduceMin": 1, "ReduceProd": 1,
        "ReduceL1": 2, "ReduceL2": 2, "ReduceSumSquare": 2, "ReduceLogSum": 1,
        "ReduceLogSumExp": 3, "ArgMax": 1, "ArgMin": 1,
    }
)
REDUCE_OUT_FLOPS: Mapping[str, float] = MappingProxyType(
    {"ReduceMean": 1, "ReduceL2": 1, "ReduceLogSum": 1, "ReduceLogSumExp": 1}
)

#: Views: a runtime changes the tensor's metadata, no bytes move (SequenceAt hands out a reference to a tensor
#: the sequence already holds: the SplitToSequence that filled it did the copying).
VIEW_OPS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Shape", "Size", "Constant",
                      "SequenceLength", "SequenceEmpty", "SequenceErase", "SequenceAt"})

#: Copies: read the whole input, write the whole output, no arithmetic.
COPY_OPS = frozenset(
    {
        "Transpose", "Concat", "Split", "Expand", "Tile", "Pad", "DepthToSpace", "SpaceToDepth",
        "ReverseSequence", "Compress", "SplitToSequence", "ConcatFromSequence", "Col2Im",
        "CenterCropPad", "Upsample", "SequenceConstruct", "SequenceInsert",
    }
)

#: Selective reads: read the index tensors and only as many data bytes as they write.
GATHER_OPS = frozenset({"Gather", "GatherElements", "GatherND", "Slice"})

#: Writers: produce a tensor from (almost) nothing.
WRITE_OPS = frozenset(
    {
        "ConstantOfShape", "Range", "RandomNormal", "RandomUniform", "RandomNormalLike",
        "RandomUniformLike", "EyeLike", "OneHot", "Multinomial",
    }
)

SCATTER_OPS = frozenset({"ScatterND", "ScatterElements", "Scatter"})

POOL_OPS = frozenset({"MaxPool", "AveragePool", "LpPool"})
GLOBAL_POOL_OPS = frozenset({"GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"})
