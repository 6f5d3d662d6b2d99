"""hvlite.elastic in one process (a one-rank job, no hvlrun): the commit format (round trips of
every kind of value, byte-for-byte determinism, refusal of what only pickle could carry, and a
clear error for every kind of corruption), ObjectState/TorchState save, restore and sync, and
the elastic sampler's split, records and state dict."""
import numpy as np
import pytest
import torch

import hvlite as hvd
from hvlite.elastic import ElasticIndexSampler, HostsUpdatedInterrupt, ObjectState, State, codec, run
from hvlite.elastic.codec import CommitFormatError
from hvlite.torch.elastic import TorchState, array_to_tensor, tensor_to_array


@pytest.fixture(scope="module", autouse=True)
def engine():
    hvd.init()
    yield


def same(a, b):
    """Deep equality that also compares array dtypes and shapes, and tuple vs list."""
    if isinstance(a, np.ndarray) or isinstance(a, np.generic):
        return type(a) is type(b) and a.dtype == b.dtype and np.shape(a) == np.shape(b) and (
            np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float) and a != a:
        return b != b
    return type(a) is type(b) and a == b


TREE = {"i": 3, "big": 2 ** 70, "f": 0.1, "nan": float("nan"), "inf": float("-inf"),
        "s": "é", "b": b"\x00\xff", "n": None, "t": True, "l": [1, [2.5, "x"]], "tu": (1, (2,)),
        0: "int key", (1, "a"): "tuple key", 2.5: "float key", None: "none key",
        "a0": np.array(5, np.int64), "a": np.arange(12, dtype=np.float32).reshape(3, 4),
        "e": np.zeros((0, 3), np.float16), "nc": np.arange(10, dtype=np.int8)[::3],
        "bf": np.ones(3, dtype=__import__("ml_dtypes").bfloat16), "c": np.array([1 + 2j]),
        "bool": np.array([True, False]), "sc": np.float32(2.5), "u": np.uint16(7)}


def test_round_trip_keeps_every_kind_of_value():
    back = codec.decode(codec.encode(TREE))
    assert same(TREE, back), back
    assert back["a"].flags.writeable and back["nc"].flags.c_contiguous


def test_encoding_is_deterministic():
    assert codec.encode(TREE) == codec.encode(codec.decode(codec.encode(TREE)))


@pytest.mark.parametrize("bad, where", [
    ({"x": object()}, "state['x']"),
    ({"x": [1, {2: set()}]}, "state['x'][1][2]"),
    ({"x": np.array([object()])}, "NumPy dtype object"),
    ({frozenset(): 1}, "dict key"),
])
def test_values_only_pickle_could_carry_are_refused(bad, where):
    with pytest.raises(TypeError, match=r"cannot commit .*%s" % __import__("re").escape(where)):
        codec.encode(bad)


def test_corruption_is_named():
    good = codec.encode({"a": np.arange(4, dtype=np.int32), "s": "x"})
    header_len = int.from_bytes(good[10:18], "little")
    cases = {
        b"garbage": "not hvlite commit data",
        good[:-1]: "truncated or padded",
        good + b"\0": "truncated or padded",
        good[:20]: "truncated",
        good.replace(b'"<i4"', b'"|O8"'): "dtype",
        good.replace(b'"shape":[4]', b'"shape":[5]'): "shape \\[5\\] and dtype <i4 has 16 bytes",
        good.replace(b'"d":', b'"q":'): "bad node",
        good[:18] + b"{" * header_len + good[18 + header_len:]: "corrupt header",
    }
    for data, message in cases.items():
        with pytest.raises(CommitFormatError, match=message):
            codec.decode(data)


def test_object_state_save_restore_sync_and_reset_callbacks():
    state = ObjectState(epoch=1, weights=np.ones(3), meta={"lr": 0.1})
    calls = []
    state.register_reset_callbacks([lambda: calls.append(1)])
    state.epoch, state.weights[0], state.meta["lr"] = 5, 7.0, 0.5
    state.restore()
    assert state.epoch == 1 and state.weights.tolist() == [1, 1, 1] and state.meta == {"lr": 0.1}
    state.epoch = 2
    state.commit()          # unmanaged: kept in memory, no driver to ask about hosts
    state.epoch = 3
    state.restore()
    assert state.epoch == 2
    state.sync()
    state.on_reset()
    assert calls == [1]


class HorovodStyleState(State):
    """A State subclass as Horovod's docs write one: its own save/restore/sync."""

    def __init__(self, value):
        self.value = value
        self._saved_value = value
        super().__init__(bcast_object=hvd.broadcast_object, get_rank=hvd.rank)

    def save(self):
        self._saved_value = self.value

    def restore(self):
        self.value = self._saved_value

    def sync(self):
        self.value = self._bcast_object(self.value)


def test_a_horovod_style_state_subclass_works_in_a_plain_job(monkeypatch):
    from hvlite.elastic import StateNotCommittableError, world
    assert HorovodStyleState.__mro__[1] is State
    state = HorovodStyleState(1)
    assert state._rank is hvd.rank and state._bcast_object is hvd.broadcast_object
    state.value = 2
    state.commit()
    state.value = 3
    state.restore()
    assert state.value == 2
    state.sync()
    assert state.value == 2
    # in a world an elastic hvlrun manages, the commit must be stored: refused, saying why
    monkeypatch.setenv("HVLRUN_ELASTIC_WORLD", "1")
    monkeypatch.setenv("HVLRUN_ELASTIC_STORE", "127.0.0.1:9")
    monkeypatch.setattr(world, "_current", None)
    with pytest.raises(StateNotCommittableError, match="HorovodStyleState subclasses State with "
                       "Horovod's own save/restore/sync.*keep it in an ObjectState"):
        state.commit()
    monkeypatch.setattr(world, "_current", None)


def test_object_state_takes_horovods_arguments():
    state = ObjectState(hvd.broadcast_object, hvd.rank, epoch=4)
    assert state.epoch == 4 and state._rank is hvd.rank


def test_object_state_refuses_a_value_at_once():
    with pytest.raises(TypeError, match="cannot commit thing of type object"):
        ObjectState(thing=object())
    # a dict key the commit cannot hold is refused at save time too (not at the first commit)
    with pytest.raises(TypeError, match=r"cannot commit counts: dict key np.int64\(1\) of type int64"):
        ObjectState(counts={np.int64(1): 2})
    with pytest.raises(TypeError, match=r"cannot commit counts\['a'\]: dict key 1.5j"):
        ObjectState(counts={"a": {(1, 1.5j): 0}})
    state = ObjectState(counts={1: 2, "x": 3, (1, "y"): 4, None: 5, 2.5: 6})
    state.counts = {np.int64(1): 2}
    with pytest.raises(TypeError, match="dict key np.int64"):
        state.commit()


def test_torch_state_round_trips_model_optimizer_and_every_dtype():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(5, 3)).sum().backward()
    opt.step()
    state = TorchState(model, opt, step=4)
    data = codec.encode(state._capture())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    opt.step()
    state._apply(codec.decode(data))
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]) and v.dtype == before[k].dtype, k
    assert codec.encode(state._capture()) == data
    for dtype in (torch.float16, torch.bfloat16, torch.int64, torch.bool, torch.complex64):
        t = (torch.arange(6) % 2).to(dtype).reshape(2, 3)
        assert torch.equal(array_to_tensor(codec.decode(codec.encode(tensor_to_array(t)))), t)
    with pytest.raises(TypeError, match="sparse"):
        tensor_to_array(torch.eye(2).to_sparse(), "w")


def test_torch_state_plain_tensor_attributes_keep_their_place():
    """Plain attributes holding tensors, bare and inside dicts, lists and tuples, come back with
    their values, container types and devices (the device of the tensor each replaces: the
    CUDA case is in tests/gpu/test_cuda_only.py)."""
    state = TorchState(best=torch.tensor(0.5), history={"loss": [torch.ones(2), 3]},
                       pair=(torch.zeros(1, dtype=torch.int64), "x"))
    data = codec.encode(state._capture())
    state.best, state.history, state.pair = torch.tensor(9.0), {"loss": [torch.zeros(2), 4]}, (
        torch.ones(1, dtype=torch.int64), "y")
    state._apply(codec.decode(data))
    assert torch.equal(state.best, torch.tensor(0.5)) and state.best.device.type == "cpu"
    assert isinstance(state.history["loss"], list) and state.history["loss"][1] == 3
    assert torch.equal(state.history["loss"][0], torch.ones(2))
    assert isinstance(state.pair, tuple) and state.pair[1] == "x"
    assert torch.equal(state.pair[0], torch.zeros(1, dtype=torch.int64))


def test_sampler_splits_records_and_resumes():
    sampler = ElasticIndexSampler(list(range(10)), shuffle=True, seed=1)
    order = list(sampler)
    assert sorted(order) == list(range(10)) and len(sampler) == 10
    sampler.record_batch(0, 4)
    sampler.merge_processed()
    saved = sampler.state_dict()
    assert saved == {"epoch": 0, "processed_indices": sorted(order[:4])}
    other = ElasticIndexSampler(list(range(10)), shuffle=True, seed=1)
    other.load_state_dict(saved)
    assert list(other) == order[4:]         # the rest, in the same order
    other.set_epoch(1)
    assert sorted(other) == list(range(10)) and list(other) != order


def test_run_without_hvlrun_lets_errors_through():
    state = ObjectState(n=0)

    @run
    def train(state):
        state.n += 1
        raise HostsUpdatedInterrupt()
    with pytest.raises(HostsUpdatedInterrupt):
        train(state)
