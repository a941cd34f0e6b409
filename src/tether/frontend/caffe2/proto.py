"""The messages of caffe2.proto a saved net uses (NetDef, OperatorDef, Argument), built at run time with
:mod:`tether.frontend.proto_schema`: field numbers and types are caffe2.proto's, the rest is skipped."""
from __future__ import annotations

from typing import Any, Dict

from tether.frontend.proto_schema import build_messages

_MESSAGES: Dict[str, str] = {
    "Argument": """
        optional string name = 1
        optional float f = 2
        optional int64 i = 3
        optional bytes s = 4
        repeated float floats = 5
        repeated int64 ints = 6
        repeated bytes strings = 7""",
    "OperatorDef": """
        repeated string input = 1
        repeated string output = 2
        optional string name = 3
        optional string type = 4
        repeated Argument arg = 5
        optional string engine = 7
        repeated string control_input = 8
        optional bool is_gradient_op = 9""",
    "NetDef": """
        optional string name = 1
        repeated OperatorDef op = 2
        optional string type = 3
        repeated Argument arg = 6
        repeated string external_input = 7
        repeated string external_output = 8""",
}

_CLASSES: Dict[str, Any] = {}


def messages() -> Dict[str, Any]:
    if not _CLASSES:
        _CLASSES.update(build_messages("caffe2", {}, _MESSAGES))
    return _CLASSES
