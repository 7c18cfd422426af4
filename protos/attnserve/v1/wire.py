"""numpy <-> attnserve.v1.Tensor, and the words of its enums.

Used by both ends of the wire: the server encodes with these functions and the
client decodes with them, so the format is defined once.
"""

from __future__ import annotations

import math
from typing import cast

import numpy as np
from google.protobuf.message import Message

from attnserve.v1 import encoder_service_pb2 as pb


def choices(enum, prefix: str) -> dict[str, int]:
    """A .proto enum's values by their names in lower case without `prefix` (and without
    UNSPECIFIED): the words the clients, the CLI and V2's parameters use for them."""
    return {
        name.removeprefix(prefix).lower(): number
        for name, number in enum.items()
        if not name.endswith("_UNSPECIFIED")
    }


POOLINGS = cast(dict[str, pb.Pooling], choices(pb.Pooling, "POOLING_"))
HEAD_REDUCTIONS = cast(  # none, mean, max
    dict[str, pb.HeadReduction], choices(pb.HeadReduction, "HEAD_REDUCTION_")
)
LAYOUTS = cast(  # full, causal_packed
    dict[str, pb.AttentionLayout], choices(pb.AttentionLayout, "ATTENTION_LAYOUT_")
)
LENS_NORMS = cast(dict[str, pb.LensNorm], choices(pb.LensNorm, "LENS_NORM_"))  # frozen, own
INTERVENTION_OPS = cast(  # add, set, scale
    dict[str, pb.InterventionOp], choices(pb.InterventionOp, "INTERVENTION_OP_")
)
PATCHING_METHODS = cast(  # activation, attribution
    dict[str, pb.PatchingMethod], choices(pb.PatchingMethod, "PATCHING_METHOD_")
)
# LogitAttribution's tensors in the .proto's order: the parts that add up to a logit, named
# as model/artifacts.py's ATTRIBUTION_PARTS names them (tests/service/test_names.py)
ATTRIBUTION_PARTS = tuple(
    field.name
    for field in pb.LogitAttribution.DESCRIPTOR.fields
    if field.message_type is pb.Tensor.DESCRIPTOR
)
NUMPY_DTYPES: dict[int, np.dtype] = {
    pb.DTYPE_FLOAT32: np.dtype("<f4"),
    pb.DTYPE_FLOAT16: np.dtype("<f2"),
    pb.DTYPE_INT32: np.dtype("<i4"),
}


def fill_tensor(tensor: pb.Tensor, array: np.ndarray, dtype: pb.Dtype = pb.DTYPE_FLOAT32) -> None:
    """Write `array`, converted to `dtype` (a Dtype value), into `tensor` in place.

    In place, because copying a finished Tensor into its parent message
    (CopyFrom) copies all its bytes once more: tens of ms for attention maps.
    """
    data = np.ascontiguousarray(array, dtype=NUMPY_DTYPES[dtype])
    tensor.shape[:] = data.shape
    tensor.dtype = dtype
    tensor.data = data.tobytes()


# Tensors of at least this many bytes stay out of their message until it is serialized
# (SplicedMessage); smaller ones cost less the usual way.
SPLICE_MIN_BYTES = 64 * 1024
_DATA = pb.Tensor.DESCRIPTOR.fields_by_name["data"].number
# EncodeResponse's `results`: the path both ends use to the tensors of each result
RESULTS_FIELD = pb.EncodeResponse.DESCRIPTOR.fields_by_name["results"].number


class SplicedMessage:
    """A message whose large tensors are written once, straight into its serialized bytes.

    protobuf's own path copies a tensor's bytes four times (tobytes, into the message, into
    the encoder's buffer, out to a bytes object; 140 ms for 32 MiB here). Spliced, the
    message is serialized without them and each follows as a second instance of its Tensor
    field that holds only `data`, which every parser merges into the first: "For embedded
    message fields, the parser merges multiple instances of the same field, as if with the
    Message::MergeFrom method" (protobuf's encoding guide, "Last One Wins").
    """

    def __init__(self, message: Message) -> None:
        self.message = message
        # (field numbers from the message down to the Tensor, the Tensor, its wire array)
        self._held: list[tuple[tuple[int, ...], pb.Tensor, np.ndarray]] = []

    def put(self, path: str, array: np.ndarray, dtype: pb.Dtype = pb.DTYPE_FLOAT32) -> None:
        """Set the Tensor at `path` (dotted field names below the message) to `array` as
        `dtype`: its shape and dtype now, its bytes when serialized if they are large."""
        tensor, numbers = self.message, []
        for name in path.split("."):
            numbers.append(tensor.DESCRIPTOR.fields_by_name[name].number)
            tensor = getattr(tensor, name)
        data = np.ascontiguousarray(array, dtype=NUMPY_DTYPES[dtype])
        if data.nbytes < SPLICE_MIN_BYTES:
            fill_tensor(tensor, data, dtype)
            return
        tensor.shape[:] = data.shape
        tensor.dtype = dtype
        self._held.append((tuple(numbers), tensor, data))

    @property
    def spliced(self) -> bool:
        return bool(self._held)

    def parts(self) -> list[bytes | memoryview]:
        """The serialized message, in pieces to join (the large tensors' arrays uncopied)."""
        parts: list[bytes | memoryview] = [self.message.SerializeToString()]
        for numbers, _, data in self._held:
            body = data.reshape(-1).view(np.uint8).data
            parts += [*nested(numbers, [_key(_DATA) + _varint(len(body))], len(body)), body]
        return parts

    def serialize(self) -> bytes:
        """The message's bytes, each large tensor copied once, into them."""
        return b"".join(self.parts())

    def filled(self) -> Message:
        """The message itself, its large tensors' bytes copied in (for JSON and the like)."""
        for _, tensor, data in self._held:
            tensor.data = data.tobytes()
        self._held.clear()
        return self.message


def nested(numbers: tuple[int, ...], parts: list, size: int = 0) -> list:
    """`parts` (their lengths summed, plus `size`) as the value of the message field path
    `numbers`: each field's key and length go in front, outermost first."""
    size += sum(len(part) for part in parts)
    headers = b""
    for number in reversed(numbers):
        header = _key(number) + _varint(size)
        headers, size = header + headers, size + len(header)
    return [headers, *parts]


def _key(number: int) -> bytes:
    """A length-delimited field's key: its number and wire type 2 (LEN)."""
    return _varint(number << 3 | 2)


def _varint(value: int) -> bytes:
    """Base 128, least significant group first, the high bit set on all but the last."""
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def to_tensor(array: np.ndarray, dtype: pb.Dtype = pb.DTYPE_FLOAT32) -> pb.Tensor:
    """A new Tensor holding `array` as `dtype`."""
    tensor = pb.Tensor()
    fill_tensor(tensor, array, dtype)
    return tensor


def from_tensor(tensor: pb.Tensor, data: bytes | memoryview | None = None) -> np.ndarray:
    """The array a Tensor carries, in its own dtype; ValueError if the bytes do not fit.
    `data`: its bytes found in place in the received message (split_tensor_data), uncopied."""
    if tensor.dtype not in NUMPY_DTYPES:
        raise ValueError(f"unsupported tensor dtype {tensor.dtype}")
    dtype = NUMPY_DTYPES[tensor.dtype]
    shape = tuple(tensor.shape)
    data = tensor.data if data is None else data
    expected = math.prod(shape) * dtype.itemsize  # math.prod: exact, and no numpy call
    if len(data) != expected:
        raise ValueError(f"tensor of shape {shape} needs {expected} bytes, has {len(data)}")
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def split_tensor_data(
    raw: bytes, message: type[Message], min_bytes: int = SPLICE_MIN_BYTES
) -> tuple[bytes, dict[tuple[int, ...], memoryview]]:
    """`raw` (a serialized `message`) without its large Tensors' `data`, and where those bytes
    lie in `raw`, by the path of field numbers down to each Tensor (a repeated field's element
    index after its number). Parsing the rest leaves each large Tensor its shape and dtype;
    numpy reads its bytes in place (from_tensor): parsing all of it would copy them into the
    message first (283 MB faulted in afresh for SmolLM2-135M's 1024-token map: 1-1.5 s of a
    call here). A field given twice counts as protobuf merges it: the last `data` wins."""
    found: dict[tuple[int, ...], memoryview] = {}
    if len(raw) < min_bytes:  # too small to hold one: spare the scan
        return raw, found
    parts = _split(memoryview(raw), 0, len(raw), message.DESCRIPTOR, (), min_bytes, found)
    return (raw if parts is None else b"".join(parts)), found


def _split(
    buffer: memoryview, pos: int, end: int, descriptor, path: tuple, min_bytes: int, found: dict
) -> list | None:
    """One message's fields in buffer[pos:end], descending into the large ones only: its bytes
    in pieces with the large Tensors' `data` left out and the lengths around them rewritten;
    None if it has none (the caller keeps the bytes as they are)."""
    parts: list = []
    kept = pos  # the start of the bytes not yet in parts, unchanged
    elements: dict[int, int] = {}  # of each repeated field so far
    while pos < end:
        start = pos
        key, pos = _read_varint(buffer, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            pos = _read_varint(buffer, pos)[1]
        elif wire_type in (1, 5):  # I64, I32
            pos += 8 if wire_type == 1 else 4
        elif wire_type == 2:  # LEN
            length, body = _read_varint(buffer, pos)
            pos = body + length
            field = descriptor.fields_by_number.get(number)
            here = (*path, number)
            if field is not None and field.is_repeated:
                here += (elements.get(number, 0),)
                elements[number] = elements.get(number, 0) + 1
            if field is None or length < min_bytes:
                continue
            if field.message_type is not None:
                if field.message_type.GetOptions().map_entry:  # parsed whole: a map's order
                    continue  # in the bytes is not its keys' order in the parsed message
                inner = _split(buffer, body, pos, field.message_type, here, min_bytes, found)
                if inner is None:
                    continue
                parts += [buffer[kept:start], *nested((number,), inner)]
            elif descriptor is pb.Tensor.DESCRIPTOR and number == _DATA:
                found[path] = buffer[body:pos]
                parts.append(buffer[kept:start])
            else:
                continue
            kept = pos
        else:
            raise ValueError(f"wire type {wire_type} at byte {pos}: not a message")
    if not parts:
        return None
    parts.append(buffer[kept:end])
    return parts


def _read_varint(buffer, pos: int) -> tuple[int, int]:
    """The varint at `pos` and the position after it."""
    value = shift = 0
    while True:
        byte = buffer[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
