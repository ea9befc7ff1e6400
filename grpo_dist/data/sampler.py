"""The epoch sampler: which dataset rows make up each training batch, reproducible and resumable."""

from __future__ import annotations

from typing import Iterator

import numpy as np


class EpochSampler:
    """Batches of dataset indices, epoch after epoch, reproducible from ``seed`` and resumable.

    Epoch ``e`` visits a permutation of ``range(num_samples)`` drawn from ``(seed, e)`` (or the
    identity when ``shuffle=False``; ``seed=None`` draws a fresh seed, which a loaded state replaces) in ``steps_per_epoch = num_samples // batch_size`` batches.
    The last ``num_samples % batch_size`` indices of each epoch's order are dropped, as verl's
    dataloader does (``drop_last=True``): every batch has exactly ``batch_size`` prompts, and since
    the order changes each epoch, different rows are left out each time.

    The sampler is an endless iterator; ``next(sampler)`` returns ``list[int]``. ``epoch`` and
    ``step_in_epoch`` always describe the *next* batch: after the last batch of an epoch they move
    to ``(epoch + 1, 0)``. ``state_dict()`` taken after any batch and loaded into a fresh sampler
    continues with exactly the batch the original would have produced next.
    """

    def __init__(self, num_samples: int, batch_size: int, *, seed: int | None, shuffle: bool):
        if batch_size <= 0:
            raise ValueError(f"data.train_batch_size={batch_size} must be positive")
        if num_samples < batch_size:
            raise ValueError(
                f"the dataset has {num_samples} prompts, fewer than data.train_batch_size={batch_size}: "
                f"no full batch can be formed; lower data.train_batch_size or add data"
            )
        self.num_samples = num_samples
        self.batch_size = batch_size
        # seed None (verl's data.seed=null): a fresh seed, kept in state_dict() so that a resume continues
        self.seed_given = seed is not None
        self.seed = int(seed) if seed is not None else int(np.random.SeedSequence().entropy % 2**63)
        self.shuffle = shuffle
        self.epoch = 0
        self.step_in_epoch = 0
        self._order: np.ndarray | None = None
        self._order_epoch = -1

    @property
    def steps_per_epoch(self) -> int:
        return self.num_samples // self.batch_size

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The order in which epoch ``epoch`` visits the indices (before dropping the tail)."""
        if not self.shuffle:
            return np.arange(self.num_samples)
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_samples)

    def __iter__(self) -> Iterator[list[int]]:
        return self

    def __next__(self) -> list[int]:
        if self._order_epoch != self.epoch:
            self._order = self.epoch_order(self.epoch)
            self._order_epoch = self.epoch
        start = self.step_in_epoch * self.batch_size
        batch = self._order[start:start + self.batch_size].tolist()
        self.step_in_epoch += 1
        if self.step_in_epoch >= self.steps_per_epoch:
            self.epoch += 1
            self.step_in_epoch = 0
        return batch

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "step_in_epoch": self.step_in_epoch,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "num_samples": self.num_samples,
            "batch_size": self.batch_size,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state``. Raises ``ValueError`` if the data or the sampling settings changed
        since it was saved, because the run could then not continue with the same batches."""
        if not self.seed_given and "seed" in state:
            self.seed, self._order_epoch = int(state["seed"]), -1  # a drawn seed: continue with the saved one
        changed = [
            f"{key}: saved {state[key]!r}, now {getattr(self, key)!r}"
            for key in ("seed", "shuffle", "num_samples", "batch_size")
            if key in state and state[key] != getattr(self, key)
        ]
        if changed:
            raise ValueError(
                "cannot resume the data sampler: " + "; ".join(changed)
                + " (num_samples is the dataset size after filtering; keep data files, data.seed, "
                  "data.shuffle, data.train_batch_size and the prompt filter as they were)"
            )
        epoch, step = int(state["epoch"]), int(state["step_in_epoch"])
        if not 0 <= step <= self.steps_per_epoch or epoch < 0:
            raise ValueError(f"sampler state out of range: epoch={epoch}, step_in_epoch={step} "
                             f"(steps_per_epoch={self.steps_per_epoch})")
        if step == self.steps_per_epoch:  # saved at the end of an epoch: the next batch opens the next one
            epoch, step = epoch + 1, 0
        self.epoch, self.step_in_epoch = epoch, step
