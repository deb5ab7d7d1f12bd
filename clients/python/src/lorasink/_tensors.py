"""Tensors on the wire: numpy arrays and torch tensors to and from the
bytes lorasink reads (safetensors bodies and base64 JSON objects).

numpy has no bfloat16, so the codec is written here, not taken from the
safetensors library: a torch bfloat16 tensor (or an ml_dtypes bfloat16
array) travels as its two-byte values, never widened on the client.
"""
import base64
import json
import struct
import sys

import numpy as np

# Wire dtype name -> (numpy dtype of the raw bytes, bytes per value).
# bf16 is carried as little-endian uint16 bit patterns.
_NP_OF = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2")}
_JSON_NAME = {"F32": "f32", "F16": "f16", "BF16": "bf16"}
_ST_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4,
            "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


class Wire:
    """One tensor as lorasink reads it: a dtype (F32, F16 or BF16), a
    shape and its little-endian bytes."""

    __slots__ = ("dtype", "shape", "data")

    def __init__(self, dtype, shape, data):
        self.dtype, self.shape, self.data = dtype, tuple(int(s) for s in shape), data


def is_torch(value):
    """True for a torch.Tensor (a subclass too), without importing torch:
    a tensor exists only where torch was imported."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def to_wire(value, what):
    """Encodes a numpy array, a torch tensor or a nested list as a Wire.
    float32, float16 and bfloat16 keep their dtype; any other real type
    (float64, integers, a Python list) becomes float32, which is what the
    server computes in."""
    if is_torch(value):
        return _torch_to_wire(value)
    arr = np.asarray(value)
    if arr.dtype.name == "bfloat16":  # ml_dtypes' bfloat16, if the caller uses it
        return Wire("BF16", arr.shape, np.ascontiguousarray(arr).view("<u2").tobytes())
    if arr.dtype.kind == "f" and arr.dtype.itemsize in (2, 4):
        wire = "F32" if arr.dtype.itemsize == 4 else "F16"
        return Wire(wire, arr.shape, np.ascontiguousarray(arr, dtype=_NP_OF[wire]).tobytes())
    if arr.dtype.kind not in "fiub":
        raise TypeError(f"{what}: dtype {arr.dtype} is not a real number type")
    return Wire("F32", arr.shape, np.ascontiguousarray(arr, dtype="<f4").tobytes())


def _torch_to_wire(t):
    import torch

    t = t.detach().resolve_conj().resolve_neg()  # lazy views numpy() refuses
    if type(t) is not torch.Tensor:
        t = t.as_subclass(torch.Tensor)
    if t.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        if t.is_complex():
            raise TypeError(f"dtype {t.dtype} is not a real number type")
        t = t.to(torch.float32)
    t = t.to("cpu").contiguous()
    if t.dtype == torch.bfloat16:
        return Wire("BF16", t.shape, t.view(torch.int16).numpy().astype("<i2", copy=False).tobytes())
    wire = "F32" if t.dtype == torch.float32 else "F16"
    return Wire(wire, t.shape, t.numpy().astype(_NP_OF[wire], copy=False).tobytes())


def wire_to_numpy(w):
    """float32 array of a Wire (bf16 widened exactly, by its bit pattern)."""
    raw = np.frombuffer(w.data, dtype=_NP_OF[w.dtype]).reshape(w.shape)
    if w.dtype == "BF16":
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.astype(np.float32)


def b64_object(w):
    """The JSON tensor object {"dtype", "shape", "data"} of a Wire."""
    return {"dtype": _JSON_NAME[w.dtype], "shape": list(w.shape), "data": base64.b64encode(w.data).decode("ascii")}


def st_encode(tensors, metadata=None):
    """A safetensors file holding the Wires of tensors (name -> Wire), in
    the given order, with optional string metadata."""
    header, offset = {}, 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, w in tensors.items():
        header[name] = {"dtype": w.dtype, "shape": list(w.shape), "data_offsets": [offset, offset + len(w.data)]}
        offset += len(w.data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the safetensors library aligns the data section to 8
    return b"".join([struct.pack("<Q", len(text)), text] + [w.data for w in tensors.values()])


def st_decode(buf):
    """(name -> Wire, metadata) of a safetensors file, with the sizes
    checked: a damaged file raises ValueError, never a short array."""
    if len(buf) < 8:
        raise ValueError("safetensors: shorter than its 8-byte header length")
    n = struct.unpack("<Q", buf[:8])[0]
    if n > len(buf) - 8:
        raise ValueError(f"safetensors: header length {n} runs past the {len(buf)}-byte file")
    header = json.loads(bytes(buf[8:8 + n]).decode("utf-8"))
    if not isinstance(header, dict):
        raise ValueError("safetensors: the header is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    data, out, end = memoryview(buf)[8 + n:], {}, 0
    for name, e in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"]):
        b, e_end = e["data_offsets"]
        count = int(np.prod(e["shape"], dtype=np.int64))
        if b != end or e_end - b != count * _ST_SIZE[e["dtype"]]:
            raise ValueError(f"safetensors: tensor {name!r}: data_offsets {[b, e_end]} do not tile the data")
        out[name], end = Wire(e["dtype"], e["shape"], bytes(data[b:e_end])), e_end
    if end != len(data):
        raise ValueError(f"safetensors: {len(data) - end} bytes after the last tensor")
    return out, meta
