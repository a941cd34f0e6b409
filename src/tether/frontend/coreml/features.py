"""A Core ML model's input features as ONNX inputs: kind, element type and shape (both model kinds read them)."""
from __future__ import annotations

from typing import List, Mapping, Optional, Sequence, Tuple

from onnx import TensorProto

from tether.errors import InvalidInput, UnsupportedOpError

ARRAY_TYPES = {65568: TensorProto.FLOAT, 65600: TensorProto.FLOAT, 65552: TensorProto.FLOAT,
               131104: TensorProto.INT32, 131080: TensorProto.INT8}
COLOR_CHANNELS = {10: 1, 20: 3, 30: 3, 40: 1}


def input_feature(feature, shape: Optional[Mapping[str, Sequence[int]]]) -> Tuple[str, int, List[int]]:
    """(kind, ONNX element type, shape) of an input feature; ``shape`` overrides a multi-array's default."""
    t = feature.type
    which = t.WhichOneof("Type")
    if which == "imageType":
        img = t.imageType
        dims = [1, COLOR_CHANNELS.get(img.colorSpace, 3), int(img.height), int(img.width)]
        if shape and feature.name in shape:
            dims = [int(d) for d in shape[feature.name]]
        return "image", TensorProto.FLOAT, dims
    if which == "multiArrayType":
        arr = t.multiArrayType
        dims = [int(d) for d in arr.shape]
        if not dims and arr.WhichOneof("ShapeFlexibility") == "enumeratedShapes" and arr.enumeratedShapes.shapes:
            dims = [int(d) for d in arr.enumeratedShapes.shapes[0].shape]
        elif not dims and arr.WhichOneof("ShapeFlexibility") == "shapeRange":
            dims = [max(int(r.lowerBound), 1) for r in arr.shapeRange.sizeRanges]
        if shape and feature.name in shape:
            dims = [int(d) for d in shape[feature.name]]
        if not dims:
            raise InvalidInput("input %r has no shape in the model; give one with shape={%r: [...]}"
                               % (feature.name, feature.name))
        return "array", ARRAY_TYPES.get(arr.dataType, TensorProto.FLOAT), dims
    if which in ("int64Type", "doubleType"):
        return "scalar", TensorProto.INT64 if which == "int64Type" else TensorProto.FLOAT, [1]
    raise UnsupportedOpError("input %r has Core ML feature type %s, which tether does not read (it reads "
                             "multi-arrays and images)" % (feature.name, which))
