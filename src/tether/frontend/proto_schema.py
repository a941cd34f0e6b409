"""Protobuf message classes from a few lines of .proto syntax, for the frontends that read a framework's protobuf
files without the framework (TensorFlow, Caffe, Caffe2): each describes only the messages and fields it reads,
with the field numbers, types and defaults of the framework's .proto, so binary and text files parse and other
fields are skipped.

``build_messages(package, enums, messages)``: ``enums`` maps "Message.Enum" (or a top-level enum name) to
"NAME=number ..."; ``messages`` maps a message name to its fields, one a line: ``optional|repeated TYPE NAME =
NUMBER`` with an optional ``[packed]`` or ``[default = VALUE]``. The classes live in a descriptor pool of their
own, so they never clash with generated modules of the same package the process may hold.
"""
from __future__ import annotations

import re
from typing import Any, Dict, List, Tuple

_FIELD = re.compile(r"^(optional|repeated) (\w+) (\w+) = (\d+)(?: \[(packed|default = ([^\]]+))\])?$")


def _file_descriptor(package: str, enums: Dict[str, str], messages: Dict[str, str]) -> Any:
    from google.protobuf import descriptor_pb2

    F = descriptor_pb2.FieldDescriptorProto
    scalars = {"float": F.TYPE_FLOAT, "double": F.TYPE_DOUBLE, "int32": F.TYPE_INT32, "int64": F.TYPE_INT64,
               "uint32": F.TYPE_UINT32, "uint64": F.TYPE_UINT64, "bool": F.TYPE_BOOL, "string": F.TYPE_STRING,
               "bytes": F.TYPE_BYTES, "fixed32": F.TYPE_FIXED32}
    fdp = descriptor_pb2.FileDescriptorProto(name="tether_%s.proto" % package, package=package, syntax="proto2")
    nested: Dict[str, List[Tuple[str, bytes]]] = {}
    for full, values in enums.items():
        owner, _, name = full.rpartition(".")
        enum = descriptor_pb2.EnumDescriptorProto(name=name)
        for item in values.split():
            key, _, number = item.partition("=")
            enum.value.add(name=key, number=int(number))
        if owner:
            nested.setdefault(owner, []).append((name, enum.SerializeToString()))
        else:
            fdp.enum_type.append(enum)
    for msg_name, body in messages.items():
        msg = fdp.message_type.add(name=msg_name)
        local_enums = {}
        for enum_name, data in nested.get(msg_name, []):
            msg.enum_type.add().ParseFromString(data)
            local_enums[enum_name] = ".%s.%s.%s" % (package, msg_name, enum_name)
        for line in body.strip().splitlines():
            m = _FIELD.match(line.strip())
            if m is None:
                raise ValueError("%s schema line %r of %s does not parse" % (package, line, msg_name))
            label, ftype, name, number, option, default = m.groups()
            field = msg.field.add(name=name, number=int(number),
                                  label=F.LABEL_REPEATED if label == "repeated" else F.LABEL_OPTIONAL)
            if ftype in scalars:
                field.type = scalars[ftype]
            elif ftype in local_enums or ftype in enums:
                field.type, field.type_name = F.TYPE_ENUM, local_enums.get(ftype, ".%s.%s" % (package, ftype))
            else:
                field.type, field.type_name = F.TYPE_MESSAGE, ".%s.%s" % (package, ftype)
            if option == "packed":
                field.options.packed = True
            elif default is not None:
                field.default_value = default
    return fdp


def build_messages(package: str, enums: Dict[str, str], messages: Dict[str, str]) -> Dict[str, Any]:
    """The message classes of ``messages``, by name."""
    from google.protobuf import descriptor_pool, message_factory

    pool = descriptor_pool.DescriptorPool()
    pool.Add(_file_descriptor(package, enums, messages))
    make = getattr(message_factory, "GetMessageClass", None)      # protobuf >= 4.21
    if make is None:
        make = message_factory.MessageFactory(pool).GetPrototype
    return {name: make(pool.FindMessageTypeByName("%s.%s" % (package, name))) for name in messages}
