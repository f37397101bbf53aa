#!/usr/bin/env python3
"""Reads a TensorBoard event file with code that shares nothing with spritetorch's writer.

TFRecord framing and CRC-32C come from crcmod (Debian: python3-crcmod); the tensorflow.Event
message is decoded by protobuf (python3-protobuf) from a descriptor declared here with the
official field numbers (tensorboard/compat/proto/event.proto, summary.proto). PNG images are
decoded here (zlib + PNG's five row filters) to plain pixel rows.

Prints one JSON object per event, one per line. Exit 77 (skip) when a module is missing, 1 on any
malformed record.
"""
import json
import struct
import sys
import zlib

try:
    import crcmod.predefined
    from google.protobuf import descriptor_pb2, descriptor_pool
    try:
        from google.protobuf import message_factory
    except ImportError:  # pragma: no cover
        message_factory = None
except ImportError as e:
    print(f"skip: {e} (apt-get install python3-crcmod python3-protobuf)", file=sys.stderr)
    sys.exit(77)

crc32c = crcmod.predefined.mkCrcFun("crc-32c")


def masked(data):
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def event_class():
    F = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="tb_check.proto", package="tbcheck",
                                               syntax="proto2")

    def message(name, fields, nested=()):
        m = descriptor_pb2.DescriptorProto(name=name)
        for field_name, number, kind, type_name, repeated in fields:
            f = m.field.add(name=field_name, number=number, type=kind,
                            label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
            if type_name:
                f.type_name = type_name
        for n in nested:
            m.nested_type.append(n)
        return m

    image = message("Image", [("height", 1, F.TYPE_INT32, None, False),
                              ("width", 2, F.TYPE_INT32, None, False),
                              ("colorspace", 3, F.TYPE_INT32, None, False),
                              ("encoded_image_string", 4, F.TYPE_BYTES, None, False)])
    value = message("Value", [("tag", 1, F.TYPE_STRING, None, False),
                              ("simple_value", 2, F.TYPE_FLOAT, None, False),
                              ("image", 4, F.TYPE_MESSAGE, ".tbcheck.Summary.Image", False)])
    summary = message("Summary", [("value", 1, F.TYPE_MESSAGE, ".tbcheck.Summary.Value", True)],
                      nested=(image, value))
    event = message("Event", [("wall_time", 1, F.TYPE_DOUBLE, None, False),
                              ("step", 2, F.TYPE_INT64, None, False),
                              ("file_version", 3, F.TYPE_STRING, None, False),
                              ("summary", 5, F.TYPE_MESSAGE, ".tbcheck.Summary", False)])
    proto.message_type.extend([summary, event])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    descriptor = pool.FindMessageTypeByName("tbcheck.Event")
    if hasattr(message_factory, "GetMessageClass"):
        return message_factory.GetMessageClass(descriptor)
    return message_factory.MessageFactory(pool).GetPrototype(descriptor)


def decode_png(data):
    """(width, height, channels, rows of bytes) of an 8-bit, non-interlaced PNG."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG signature")
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])[0] != zlib.crc32(kind + body):
            raise ValueError(f"PNG chunk {kind} CRC mismatch")
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, color_type, _, _, interlace = header
    if depth != 8 or interlace != 0:
        raise ValueError(f"unexpected PNG depth {depth} / interlace {interlace}")
    channels = {0: 1, 2: 3, 4: 2, 6: 4}[color_type]
    raw, stride, rows, previous = zlib.decompress(idat), width * channels, [], bytearray(width * channels)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up, up_left = previous[i], previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - up_left
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - up_left)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else up_left)) & 0xFF
            elif kind != 0:
                raise ValueError(f"PNG filter {kind}")
        rows.append(list(line))
        previous = line
    return width, height, channels, rows


def main(path):
    Event = event_class()
    data = open(path, "rb").read()
    pos = 0
    while pos < len(data):
        if len(data) - pos < 12:
            raise ValueError(f"truncated record header at byte {pos}")
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        if header_crc != masked(header):
            raise ValueError(f"length CRC mismatch at byte {pos}")
        payload = data[pos + 12:pos + 12 + length]
        (payload_crc,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
        if len(payload) != length or payload_crc != masked(payload):
            raise ValueError(f"payload CRC mismatch at byte {pos}")
        pos += 16 + length
        event = Event()
        event.ParseFromString(payload)
        out = {"wall_time": event.wall_time, "step": event.step}
        if event.HasField("file_version"):
            out["file_version"] = event.file_version
        if event.HasField("summary"):
            out["values"] = []
            for v in event.summary.value:
                value = {"tag": v.tag}
                if v.HasField("simple_value"):
                    value["simple_value"] = v.simple_value
                if v.HasField("image"):
                    w, h, c, rows = decode_png(v.image.encoded_image_string)
                    value["image"] = {"height": v.image.height, "width": v.image.width,
                                      "colorspace": v.image.colorspace,
                                      "png": {"width": w, "height": h, "channels": c, "rows": rows}}
                out["values"].append(value)
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: read_tfevents.py EVENT_FILE", file=sys.stderr)
        sys.exit(2)
    try:
        sys.exit(main(sys.argv[1]))
    except (ValueError, KeyError, struct.error, zlib.error) as e:
        print(f"{sys.argv[1]}: {e}", file=sys.stderr)
        sys.exit(1)
