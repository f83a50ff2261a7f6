"""Message classes built at import time from a table of fields, in a private descriptor pool:
the collector's wire views (fields kept as bytes where only identity matters) and the
remote-write messages, without generated code and without clashing with other copies of
the same message names in the default pool.

A table maps each message to its fields ``(name, number, repeated, type[, oneof])``: ``type``
is a scalar's name (``bytes``, ``string``, ``double``, ...), another message of the table, or
an enum of ``enums`` (``"Message.Enum"``, declared inside that message).
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {"bytes": _F.TYPE_BYTES, "string": _F.TYPE_STRING, "double": _F.TYPE_DOUBLE, "bool": _F.TYPE_BOOL,
            "fixed64": _F.TYPE_FIXED64, "sfixed64": _F.TYPE_SFIXED64, "int32": _F.TYPE_INT32,
            "int64": _F.TYPE_INT64, "uint32": _F.TYPE_UINT32}


def message_classes(package: str, messages: dict[str, list[tuple]], syntax: str = "proto3",
                    enums: dict[str, tuple[str, ...]] | None = None) -> dict[str, type]:
    """The classes of ``messages`` (name -> class). ``enums``: "Message.Enum" -> value names, numbered from 0."""
    enums = enums or {}
    fdp = descriptor_pb2.FileDescriptorProto(name=f"{package.replace('.', '/')}.proto", package=package,
                                             syntax=syntax)
    for message_name, fields in messages.items():
        message = fdp.message_type.add(name=message_name)
        oneofs: dict[str, int] = {}
        for name, number, repeated, type_name, *oneof in fields:
            field = message.field.add(name=name, number=number,
                                      label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL)
            if type_name in _SCALARS:
                field.type = _SCALARS[type_name]
            else:
                field.type = _F.TYPE_ENUM if type_name in enums else _F.TYPE_MESSAGE
                field.type_name = f".{package}.{type_name}"
            if oneof:
                if oneof[0] not in oneofs:
                    oneofs[oneof[0]] = len(message.oneof_decl)
                    message.oneof_decl.add(name=oneof[0])
                field.oneof_index = oneofs[oneof[0]]
    for qualified, values in enums.items():
        owner, enum_name = qualified.split(".")
        enum = next(m for m in fdp.message_type if m.name == owner).enum_type.add(name=enum_name)
        for number, value in enumerate(values):
            enum.value.add(name=value, number=number)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}"))
            for name in messages}
