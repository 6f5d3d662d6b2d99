"""torch tensors as the engine's sources and results: dtype codes, the CUDA ready event, the
refusal inside a CUDA graph capture, output allocators, and GPU results adopted by torch.

Contract (private to ``hvlite.torch``; ``ops.py`` builds the collectives on it):
  * ``_check_tensor(t)`` raises ``TypeError`` for a non-tensor, an unsupported dtype or a device
    that is neither CPU nor CUDA; ``_source(t)`` is the engine's view of a tensor's input (its
    address, memory kind and, for CUDA, the ready event recorded on the device's current
    stream, after ``_refuse_capture`` refused a stream that is capturing a graph);
  * ``_output(t)``/``_in_place(t)`` are the engine's view of where a result goes; ``_outputs``
    keeps each pending result's tensor alive until its handle is waited for;
  * ``_adopt_device`` hands a GPU result the engine allocated to torch (copied into torch's
    memory on a ``torch.cuda.ExternalStream``, which its maker may destroy first).
"""
import math

import torch

from .. import buffers
from ..buffers import CUDA_MEMORY, NULL, DeviceBuffer, allocate, memory, pointer
from ..collectives import InPlace, Source
from ..dtypes import by_name
from ..errors import HvliteInvalidArgument, HvliteNotSupportedError
from ..handles import submit_group

_CODES = {}                 # torch.dtype -> engine code, filled on first use


def _engine_dtype(tensor):
    try:
        return _CODES[tensor.dtype]
    except KeyError:
        code = _CODES[tensor.dtype] = by_name(str(tensor.dtype).replace("torch.", ""))
        return code


def _check_tensor(tensor):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError("hvlite.torch expects a torch.Tensor, got %s" % type(tensor).__name__)
    if tensor.device.type not in ("cpu", "cuda"):
        raise TypeError("hvlite.torch: %s tensors are not supported (CPU and CUDA tensors are); "
                        "move the tensor to one of those" % tensor.device.type)
    if tensor.is_sparse:
        raise TypeError("hvlite.torch: sparse tensors are not supported by this op")
    return tensor


def _submit_group(submit_one, tensors, name, kind, process_set):
    """``submit_group`` of torch tensors, which must be on one device, as Horovod requires: a
    group is one fused batch, and host and CUDA memory never fuse. Refused before anything is
    submitted."""
    devices = {t.device for t in tensors if isinstance(t, torch.Tensor)}
    if len(devices) > 1:
        raise HvliteInvalidArgument("%s%s: the tensors of a group must be on one device, got %s"
                                    % (kind, " '%s'" % name if name else "",
                                       " and ".join(sorted(str(d) for d in devices))))
    return submit_group(submit_one, tensors, name, kind, process_set)


def _needs_graph(tensor):
    """Whether a differentiable op must go through its autograd Function: only where autograd
    records this call. Elsewhere (metrics, no_grad, tensors without grad) the Function's cost,
    about 20 us a call, buys nothing."""
    return tensor.requires_grad and torch.is_grad_enabled()


def _ptr(tensor):
    return pointer(tensor.data_ptr()) if tensor.numel() else NULL


class _ReadyEvent:
    """Stream order of a CUDA input: called once at submit (after the output was allocated, so
    the output's earlier uses are ordered too), it records an event on the current stream of
    the tensor's device and returns it for the engine, whose copies wait for it on the engine's
    own stream. Kept alive with the input until the handle completes."""

    __slots__ = ("device", "event")

    def __init__(self, device):
        self.device, self.event = device, None

    def __call__(self):
        self.event = torch.cuda.Event()
        self.event.record(torch.cuda.current_stream(self.device))
        return pointer(self.event.cuda_event)


def _refuse_capture(device):
    """Refuses a CUDA collective while the current stream of ``device`` is capturing a CUDA graph
    (``torch.cuda.graph``): its ready event would be recorded into the capture, and the engine's
    stream, waiting on it from outside the graph, would join the capture and invalidate it (and
    fail the engine's own work). Checked before anything is recorded or submitted."""
    if device.index == torch.cuda.current_device():
        capturing = torch.cuda.is_current_stream_capturing()
    else:
        with torch.cuda.device(device):
            capturing = torch.cuda.is_current_stream_capturing()
    if capturing:
        raise HvliteNotSupportedError(
            "hvlite.torch: a collective of CUDA tensors cannot be captured in a CUDA graph (the current "
            "stream of %s is capturing): hvlite runs it on its own stream, outside the graph; call it "
            "before or after the capture, outside torch.cuda.graph" % device)


def _source(tensor):
    """The engine's view of a contiguous, detached tensor (CPU or CUDA)."""
    if not tensor.is_cuda:
        return Source(_ptr(tensor), _engine_dtype(tensor), tuple(tensor.shape), tensor)
    _refuse_capture(tensor.device)
    ready = _ReadyEvent(tensor.device)
    return Source(_ptr(tensor), _engine_dtype(tensor), tuple(tensor.shape), (tensor, ready),
                  CUDA_MEMORY, tensor.device.index, ready)


class _TensorOutput:
    """Output allocator of torch results of one dtype on one device (see hvlite.collectives).
    On the CPU, from ``buffers.ENGINE_MEMORY_MIN`` bytes a fresh result is a tensor over engine
    memory, which the engine reuses from call to call already faulted in; below,
    ``torch.empty`` is cheaper (2 us against 4 us) and measured no page faults (see
    hvlite.buffers). On a CUDA device a result is ``torch.empty`` there (the framework's own
    allocator); results the engine sizes (allgather, alltoall) are adopted where NCCL ran them
    (the engine allocated them on the GPU, see ``_adopt_device``), and copied there from the
    engine's host memory where the staged path did."""

    __slots__ = ("dtype", "itemsize", "device")

    def __init__(self, dtype, device):
        self.dtype = dtype
        self.itemsize = dtype.itemsize
        self.device = device

    def new(self, shape):
        nbytes = math.prod(shape) * self.itemsize
        if self.device.type == "cuda" or nbytes < buffers.ENGINE_MEMORY_MIN:
            out = torch.empty(shape, dtype=self.dtype, device=self.device)
            return out, _ptr(out)
        owner = allocate(nbytes)
        return self.over(owner, shape), owner

    def over(self, owner, shape):
        nbytes = math.prod(shape) * self.itemsize
        if nbytes == 0:
            return torch.empty(shape, dtype=self.dtype, device=self.device)
        if isinstance(owner, DeviceBuffer):
            return _adopt_device(owner, nbytes, self.device).view(self.dtype).reshape(shape)
        host = torch.frombuffer(memory(owner, nbytes), dtype=self.dtype).reshape(shape)
        if self.device.type == "cpu":
            return host
        # on the caller's stream, without waiting for it: a copy from pageable memory returns
        # once CUDA holds the bytes, so the engine memory may go as soon as this returns
        return host.to(self.device, non_blocking=True)


class _DeviceResult:
    """An engine result in GPU memory as torch adopts it: CUDA array interface version 2 (no
    stream, so torch does not synchronise: the engine's stream finished writing it before the
    handle completed), bytes that the caller views as its dtype. torch holds this object, and
    with it the ``DeviceBuffer``, as long as the tensor's storage lives."""

    __slots__ = ("buffer", "nbytes")

    def __init__(self, buffer, nbytes):
        self.buffer, self.nbytes = buffer, nbytes

    @property
    def __cuda_array_interface__(self):
        return {"shape": (self.nbytes,), "typestr": "|u1", "data": (self.buffer.address, False),
                "strides": None, "version": 2}


def _is_external(stream):
    """Whether ``stream`` wraps a CUDA stream torch did not make (``torch.cuda.ExternalStream``),
    which its maker may destroy at any time. torch gives such a stream its handle as its id (an
    even number); its own streams have odd ids, its default stream 0. Unknown: taken as external."""
    sid = getattr(stream, "stream_id", None)
    return not isinstance(sid, int) or (sid != 0 and sid % 2 == 0)


def _adopt_device(buffer, nbytes, device):
    """A uint8 tensor over an engine result on ``device``, freed (stream-ordered) on the stream
    that is current when it is adopted: the caller's, where the result is safe to use. torch's
    ``record_stream`` does nothing for memory it did not allocate, so a caller that uses the
    result on another stream keeps it alive until that stream is done with it (or clones it).
    On an external stream, which may be gone by the time the result is freed, the result is
    copied into torch's own memory on it instead, and the engine's freed behind the copy."""
    stream = torch.cuda.current_stream(device)
    buffer.stream = stream.cuda_stream
    adopted = torch.as_tensor(_DeviceResult(buffer, nbytes), device=device)
    if not _is_external(stream):
        return adopted
    copy = adopted.clone()
    del adopted
    buffer.free()
    return copy


_outputs = {}


def _output(tensor):
    """The output allocator for results like ``tensor`` (its dtype and device)."""
    key = (tensor.dtype, tensor.device)
    output = _outputs.get(key)
    if output is None:
        output = _outputs[key] = _TensorOutput(tensor.dtype, tensor.device)
    return output


def _in_place(tensor):
    """(source, output, finish) of an in-place call: a non-contiguous tensor is sent as a
    contiguous copy and the result copied back; the tensor's version is bumped so autograd
    refuses to reuse its old value in a backward pass."""
    target = _check_tensor(tensor)
    buf = target.detach() if target.is_contiguous() else target.detach().contiguous()
    source = _source(buf)

    def finish(result):
        if buf.data_ptr() != target.data_ptr():
            with torch.no_grad():
                target.copy_(buf)
        else:
            torch.autograd.graph.increment_version(target)
        return target
    return source, InPlace(target, source.pointer), finish
