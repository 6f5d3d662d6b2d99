"""The index logic of Horovod's ``ElasticSampler``, framework-neutral.

Contract (Horovod's documented behaviour):
  * ``ElasticIndexSampler(dataset, shuffle=True, seed=0)`` splits the indices of ``dataset``
    (anything with ``len``) that have not been processed in the current epoch across the
    current world: shuffled by ``seed + epoch`` when ``shuffle`` (the same order on every rank
    and in every world), padded by repeating from the start to a multiple of the world's size,
    rank ``r`` taking every ``size``-th index from ``r``. ``__iter__`` yields this rank's
    indices, ``__len__`` counts them.
  * ``record_batch(batch_idx, batch_size)`` marks this rank's indices of that batch of the
    current pass as processed (``get_indices`` returns them); ``record_indices(indices)``
    marks any indices. ``set_epoch(epoch)`` starts an epoch: nothing processed, indices
    re-split. ``state_dict()``/``load_state_dict()`` carry the epoch and the processed
    indices; loading re-splits what is left over the current world, so a re-formed world
    neither redoes nor skips samples of the epoch. ``reset()`` re-splits for the current world.
  * ``merge_processed()`` is collective: every rank learns the indices every rank processed
    since the last merge. An elastic state calls it at each commit, so a commit holds the whole
    world's progress, not just rank 0's.
  * Needs ``hvlite.init()`` first (it asks for the world's size and this rank).
"""
import itertools
from typing import Any, Dict, Iterable, Iterator, List

import numpy as np

from ..basics import rank, size
from ..ops import allgather

__all__ = ["ElasticIndexSampler"]

_numbers = itertools.count()     # samplers are made in the same order on every rank


class ElasticIndexSampler:
    """Which samples of a data set this rank takes in the current world, so that a re-formed
    world neither repeats nor skips the samples already processed this epoch.

    Framework-neutral: ``hvlite.torch.elastic.ElasticSampler`` is a torch ``Sampler`` built on
    it. Record what each step processed (:meth:`record_batch` or :meth:`record_indices`), keep
    the sampler in the elastic state, and call :meth:`set_epoch` at each epoch's start.

    Args:
        dataset: anything with ``len()``.
        shuffle: shuffle the indices, the same way on every rank (seeded by ``seed`` and the
            epoch).
        seed: the shuffle's seed.
    """

    def __init__(self, dataset: Any, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        """The data set whose indices are split."""
        self.shuffle = shuffle
        """Whether the indices are shuffled each epoch."""
        self.seed = seed
        """The shuffle's seed."""
        self.epoch = 0
        """The epoch in progress (set by :meth:`set_epoch`)."""
        self.processed_indices: set = set()
        """The indices processed this epoch, this rank's and, as of the last merge (each commit
        merges them), the other ranks'."""
        self._unmerged: List[int] = []
        self.indices: List[int] = []
        """This rank's indices of the epoch's remaining samples, in the current world."""
        self._name = "hvlite.elastic.sampler.%d" % next(_numbers)
        self.reset()

    def reset(self) -> None:
        """Split the indices not yet processed this epoch over the current world."""
        self.num_replicas, self.rank = size(), rank()
        order = np.arange(len(self.dataset))
        if self.shuffle:
            np.random.RandomState((self.seed + self.epoch) % (1 << 32)).shuffle(order)
        remaining = [int(i) for i in order if int(i) not in self.processed_indices]
        self.remaining_indices = remaining
        total = -(-len(remaining) // self.num_replicas) * self.num_replicas
        padded = list(np.resize(np.asarray(remaining, np.int64), total)) if remaining else []
        self.indices = [int(i) for i in padded[self.rank::self.num_replicas]]
        self.num_samples = len(self.indices)

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch``: nothing processed yet; split every index over the world."""
        self.epoch = epoch
        self.processed_indices = set()
        self._unmerged = []
        self.reset()

    def get_indices(self, batch_idx: int, batch_size: int) -> List[int]:
        """This rank's indices of batch ``batch_idx`` of the current pass."""
        start = batch_idx * batch_size
        return self.indices[start:start + batch_size]

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Mark this rank's indices of batch ``batch_idx`` as processed."""
        self.record_indices(self.get_indices(batch_idx, batch_size))

    def record_indices(self, indices: Iterable[int]) -> None:
        """Mark ``indices`` as processed."""
        for index in indices:
            index = int(index)
            if index not in self.processed_indices:
                self.processed_indices.add(index)
                self._unmerged.append(index)

    def merge_processed(self) -> None:
        """Learn every rank's processed indices since the last merge. Collective."""
        mine = np.asarray(self._unmerged, dtype=np.int64)
        every = allgather(mine, name=self._name)
        self.processed_indices.update(int(i) for i in every)
        self._unmerged = []

    def state_dict(self) -> Dict[str, Any]:
        """``{"epoch": ..., "processed_indices": [...]}`` (sorted)."""
        return {"epoch": self.epoch, "processed_indices": sorted(self.processed_indices)}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Take the epoch and processed indices of ``state_dict`` and re-split the rest."""
        self.epoch = int(state_dict["epoch"])
        self.processed_indices = set(int(i) for i in state_dict["processed_indices"])
        self._unmerged = []
        self.reset()

    def __iter__(self) -> Iterator[int]:
        return iter(list(self.indices))

    def __len__(self) -> int:
        return self.num_samples
