"""An independent safetensors reader and writer for the tests: a few lines of numpy written from the
format's description (8-byte little-endian header length, JSON header, data), sharing nothing with
fsdp.c. Also bf16 rounding by the definition of round-to-nearest-even (the nearer of the two bf16
neighbours, ties to the even one), computed in float64 without the bit trick fsdp.c uses."""
import json
import struct

import numpy as np

NUMPY = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64, "I32": np.int32,
         "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_, "BF16": np.uint16}


def read(path):
    """{name: (dtype, shape, numpy array)} and the __metadata__ (None if absent). BF16 comes back as
    its uint16 bit patterns; to_f32 turns those into float32."""
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = blob[8 + n:]
    meta = header.pop("__metadata__", None)
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        arr = np.frombuffer(data[b:end], dtype=np.dtype(NUMPY[e["dtype"]]).newbyteorder("<"))
        out[name] = (e["dtype"], list(e["shape"]), arr.reshape(e["shape"]))
    return out, meta, header, n


def header_of(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n).decode("utf-8")), n


def to_f32(dtype, arr):
    if dtype == "BF16":
        return (arr.astype(np.uint32) << 16).view(np.float32)
    return arr.astype(np.float32)


def bf16_nearest_even(x):
    """uint16 bf16 bit patterns of float32 values x, by the definition of round-to-nearest-even."""
    x = np.ascontiguousarray(x, dtype=np.float32).ravel()
    bits = x.view(np.uint32)
    low = bits & np.uint32(0xFFFF0000)                      # toward zero: same sign, mantissa cut
    exp = ((low >> 23) & 0xFF).astype(np.int64)
    ulp = np.ldexp(1.0, np.maximum(exp, 1) - 127 - 7)       # one step of the 7-bit mantissa
    sign = np.where(bits >> 31, -1.0, 1.0)
    lo = low.view(np.float32).astype(np.float64)
    hi = lo + sign * ulp                                     # away from zero (may be past the largest)
    xd = x.astype(np.float64)
    d_lo, d_hi = np.abs(xd - lo), np.abs(hi - xd)
    lo16 = (low >> 16).astype(np.uint32)
    hi16 = lo16 + 1                                          # next magnitude; 0x7f7f + 1 = infinity
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & ((lo16 & 1) == 1))
    out = np.where(pick_hi, hi16, lo16).astype(np.uint16)
    special = (bits & 0x7F800000) == 0x7F800000              # infinities and NaNs keep their class
    out = np.where(special & ((bits & 0x7FFFFF) == 0), (bits >> 16).astype(np.uint16), out)
    nan = special & ((bits & 0x7FFFFF) != 0)
    out = np.where(nan, np.uint16(0x7FC0) | ((bits >> 16) & 0x8000).astype(np.uint16), out)
    return out


def write(path, tensors, metadata=None, order=None, pad=0, header_extra=None):
    """tensors: {name: (dtype, shape, numpy array of the dtype's bits)}. Data in `order` (default:
    reverse name order, unlike fsdp.c's writer), `pad` extra spaces after the JSON."""
    names = order or sorted(tensors, reverse=True)
    header, chunks, at = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name in names:
        dtype, shape, arr = tensors[name]
        raw = np.ascontiguousarray(arr).astype(np.dtype(NUMPY[dtype]).newbyteorder("<")).tobytes()
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [at, at + len(raw)]}
        chunks.append(raw)
        at += len(raw)
    if header_extra:
        header.update(header_extra)
    text = json.dumps(header).encode("utf-8") + b" " * pad
    write_raw(path, text, b"".join(chunks))


def write_raw(path, header_bytes, data, length=None):
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header_bytes) if length is None else length))
        f.write(header_bytes)
        f.write(data)
