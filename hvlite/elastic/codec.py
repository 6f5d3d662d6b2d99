"""The commit format: training state as bytes, without pickle.

Contract:
  * :func:`encode` turns a state tree into bytes; :func:`decode` turns them back. A tree is built
    from ``None``, ``bool``, ``int``, ``float`` (NaN and infinities too), ``str``, ``bytes``,
    ``list``, ``tuple``, ``dict`` (keys: any of these scalars or tuples of them), NumPy arrays
    and scalars of plain numeric dtypes (``bfloat16`` from ``ml_dtypes`` too), and
    :class:`Array` (a framework's tensor as raw bytes: ``kind``, ``dtype`` name, shape; the
    adapters make and read these). Anything else raises ``TypeError`` naming the path to it
    (e.g. ``state['optimizer']['state'][0]['extra']``), so a commit never holds an object only
    pickle could carry.
  * The bytes are ``MAGIC``, an 8-byte little-endian header length, a JSON header (the tree,
    arrays replaced by references) and the arrays' raw bytes back to back. Encoding is
    deterministic: the same tree gives the same bytes (dicts keep their order), so equal
    digests (:func:`digest`, :func:`tree_digest`) mean equal states.
  * :func:`decode` checks everything before it builds anything: the magic, the lengths, the JSON,
    every node's shape, dtype names against an allow-list (never an object dtype), and that
    each array's bytes lie inside the data. Any violation raises :class:`CommitFormatError`
    (a ``ValueError``) saying what is wrong. Decoded arrays are fresh, writable copies.
  * Pure: no engine, no framework, no I/O.
"""
import hashlib
import json
import math
import struct
from typing import Any, List, NamedTuple, Tuple

import numpy as np

__all__ = ["MAGIC", "Array", "CommitFormatError", "encode", "decode", "digest", "tree_digest"]

MAGIC = b"HVLSTATE1\n"
_LEN = struct.Struct("<Q")
# dtypes an array may have: plain numbers only (never "O"), byte order explicit.
_NUMPY_KINDS = "biufc"


class CommitFormatError(ValueError):
    """Bytes that are not a well-formed commit (corrupt, truncated, or not ours)."""


class Array(NamedTuple):
    """A framework tensor as raw bytes: ``kind`` (e.g. ``"torch"``), its ``dtype`` name (the
    framework's own, e.g. ``"bfloat16"``), ``shape`` and ``data`` (a 1-d uint8 NumPy array of
    the C-order bytes)."""
    kind: str
    dtype: str
    shape: Tuple[int, ...]
    data: np.ndarray


def _bfloat16():
    try:
        import ml_dtypes
    except ImportError:
        return None
    return np.dtype(ml_dtypes.bfloat16)


def _dtype_name(dtype: np.dtype) -> str:
    if dtype == _bfloat16():
        return "bfloat16"
    if dtype.kind not in _NUMPY_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise TypeError("dtype %s" % dtype)
    return dtype.str


def _dtype_from(name: str) -> np.dtype:
    if name == "bfloat16" and _bfloat16() is not None:
        return _bfloat16()
    try:
        dtype = np.dtype(name)
    except TypeError:
        raise CommitFormatError("unknown dtype %r" % name) from None
    if dtype.kind not in _NUMPY_KINDS or dtype.fields is not None or dtype.str != name:
        raise CommitFormatError("dtype %r is not allowed in a commit" % name)
    return dtype


class _Encoder:
    def __init__(self) -> None:
        self.chunks: List[memoryview] = []
        self.offset = 0

    def blob(self, data: memoryview) -> List[int]:
        ref = [self.offset, data.nbytes]
        self.chunks.append(data)
        self.offset += data.nbytes
        return ref

    def node(self, obj: Any, path: str) -> Any:
        if obj is None or isinstance(obj, (bool, str)):
            return obj
        if isinstance(obj, int):
            return obj
        if isinstance(obj, float):
            return obj if math.isfinite(obj) else {"f": repr(obj)}
        if isinstance(obj, (bytes, bytearray)):
            return {"b": self.blob(memoryview(bytes(obj)))}
        if isinstance(obj, Array):      # before tuple: an Array is a NamedTuple
            data = np.ascontiguousarray(obj.data).view(np.uint8).reshape(-1)
            return {"a": self.blob(memoryview(data)), "kind": str(obj.kind),
                    "dtype": str(obj.dtype), "shape": [int(n) for n in obj.shape]}
        if isinstance(obj, (list, tuple)):
            items = [self.node(v, "%s[%d]" % (path, i)) for i, v in enumerate(obj)]
            return {"t" if isinstance(obj, tuple) else "l": items}
        if isinstance(obj, dict):
            return {"d": [[self.key(k, path), self.node(v, "%s[%r]" % (path, k))]
                          for k, v in obj.items()]}
        if isinstance(obj, (np.ndarray, np.generic)):
            return self.numpy(obj, path)
        raise TypeError("cannot commit %s of type %s: a commit holds numbers, strings, bytes, "
                        "lists, tuples, dicts and arrays (no pickle)" % (path, type(obj).__name__))

    def numpy(self, obj: Any, path: str) -> Any:
        arr = np.asarray(obj)       # (np.ascontiguousarray would make a 0-d array 1-d)
        if not arr.flags.c_contiguous:
            arr = arr.copy(order="C")
        try:
            name = _dtype_name(arr.dtype)
        except TypeError:
            raise TypeError("cannot commit %s: NumPy dtype %s is not a plain number type"
                            % (path, arr.dtype)) from None
        raw = arr.reshape(-1).view(np.uint8) if arr.size else np.empty(0, np.uint8)
        node = {"a": self.blob(memoryview(raw)), "kind": "numpy", "dtype": name,
                "shape": list(arr.shape)}
        if isinstance(obj, np.generic):
            node["kind"] = "numpy-scalar"
        return node

    def key(self, key: Any, path: str) -> Any:
        return encode_key(key, path)


def encode_key(key: Any, path: str) -> Any:
    """Return the commit form of dict key ``key`` of the dict at ``path``: None, a bool, int,
    str or finite float as it is, a tuple of those as ``{"t": [...]}``.

    Raises:
        TypeError: any other key (a NumPy scalar, say), naming the path and the key's type.
    """
    if key is None or isinstance(key, (bool, int, str)) or (
            isinstance(key, float) and math.isfinite(key)):
        return key
    if isinstance(key, tuple):
        return {"t": [encode_key(k, path) for k in key]}
    raise TypeError("cannot commit %s: dict key %r of type %s"
                    % (path, key, type(key).__name__))


def _parts(tree: Any) -> List[Any]:
    """The commit bytes of ``tree`` in pieces (header, then each array's memory, uncopied)."""
    enc = _Encoder()
    header = json.dumps({"tree": enc.node(tree, "state"), "size": enc.offset},
                        separators=(",", ":"), allow_nan=False).encode("utf-8")
    return [MAGIC, _LEN.pack(len(header)), header] + enc.chunks


def encode(tree: Any) -> bytes:
    """Return the commit bytes of ``tree`` (see the module contract).

    Raises:
        TypeError: a value the format cannot hold; the message names where it is in the tree.
    """
    return b"".join(_parts(tree))


def tree_digest(tree: Any) -> bytes:
    """Return ``digest(encode(tree))`` without assembling the bytes. Raises as :func:`encode`."""
    hasher = hashlib.sha256()
    for part in _parts(tree):
        hasher.update(part)
    return hasher.digest()


class _Decoder:
    def __init__(self, payload: memoryview) -> None:
        self.payload = payload

    def blob(self, ref: Any) -> memoryview:
        if (not isinstance(ref, list) or len(ref) != 2 or not all(type(v) is int for v in ref)
                or ref[0] < 0 or ref[1] < 0 or ref[0] + ref[1] > len(self.payload)):
            raise CommitFormatError("bad data reference %r" % (ref,))
        return self.payload[ref[0]:ref[0] + ref[1]]

    def node(self, obj: Any) -> Any:
        if obj is None or type(obj) in (bool, int, float, str):
            return obj
        keys = set(obj) if type(obj) is dict else None
        if keys in ({"l"}, {"t"}) and type(obj.get("l", obj.get("t"))) is list:
            items = [self.node(v) for v in obj.get("l", obj.get("t"))]
            return items if "l" in keys else tuple(items)
        if keys == {"d"} and type(obj["d"]) is list:
            out = {}
            for pair in obj["d"]:
                if type(pair) is not list or len(pair) != 2:
                    raise CommitFormatError("bad dict entry %.80r" % (pair,))
                out[self.key(pair[0])] = self.node(pair[1])
            return out
        if keys == {"f"} and obj["f"] in ("nan", "inf", "-inf"):
            return float(obj["f"])
        if keys == {"b"}:
            return bytes(self.blob(obj["b"]))
        if keys == {"a", "kind", "dtype", "shape"}:
            return self.array(obj)
        raise CommitFormatError("bad node %.80r" % (obj,))

    def array(self, obj: dict) -> Any:
        shape = obj["shape"]
        if type(shape) is not list or not all(type(n) is int and n >= 0 for n in shape):
            raise CommitFormatError("bad shape %r" % (shape,))
        if type(obj["kind"]) is not str or type(obj["dtype"]) is not str:
            raise CommitFormatError("bad array node %.80r" % (obj,))
        raw = self.blob(obj["a"])
        if obj["kind"] not in ("numpy", "numpy-scalar"):
            return Array(obj["kind"], obj["dtype"], tuple(shape),
                         np.frombuffer(raw, dtype=np.uint8).copy())
        dtype = _dtype_from(obj["dtype"])
        if len(raw) != dtype.itemsize * math.prod(shape):
            raise CommitFormatError("array of shape %s and dtype %s has %d bytes"
                                    % (shape, obj["dtype"], len(raw)))
        arr = np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
        if obj["kind"] == "numpy-scalar":
            if shape:
                raise CommitFormatError("scalar of shape %s" % shape)
            return arr[()]
        return arr

    def key(self, key: Any) -> Any:
        if key is None or type(key) in (bool, int, float, str):
            return key
        if type(key) is dict and set(key) == {"t"} and type(key["t"]) is list:
            return tuple(self.key(k) for k in key["t"])
        raise CommitFormatError("bad dict key %.80r" % (key,))


def decode(data: bytes) -> Any:
    """Return the tree that :func:`encode` made ``data`` from.

    Raises:
        CommitFormatError: ``data`` is not a well-formed commit; the message says what is wrong.
    """
    view = memoryview(data)
    start = len(MAGIC) + _LEN.size
    if len(view) < start or bytes(view[:len(MAGIC)]) != MAGIC:
        raise CommitFormatError("not hvlite commit data (no %r header)" % MAGIC)
    (header_len,) = _LEN.unpack(view[len(MAGIC):start])
    if header_len > len(view) - start:
        raise CommitFormatError("truncated: header of %d bytes, %d left"
                                % (header_len, len(view) - start))
    try:
        header = json.loads(bytes(view[start:start + header_len]).decode("utf-8"),
                            parse_constant=lambda c: _refuse_constant(c))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CommitFormatError("corrupt header: %s" % e) from None
    if type(header) is not dict or set(header) != {"tree", "size"}:
        raise CommitFormatError("corrupt header: unexpected fields")
    payload = view[start + header_len:]
    if header["size"] != len(payload):
        raise CommitFormatError("truncated or padded: %d data bytes, header says %r"
                                % (len(payload), header["size"]))
    try:
        return _Decoder(payload).node(header["tree"])
    except RecursionError:
        raise CommitFormatError("nested too deeply") from None


def _refuse_constant(name: str) -> None:
    raise CommitFormatError("bare %s in the header (non-finite floats are tagged)" % name)


def digest(data: bytes) -> bytes:
    """Return the SHA-256 of commit bytes (32 bytes). Cannot fail."""
    return hashlib.sha256(data).digest()
