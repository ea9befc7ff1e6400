"""Worker shell around the frozen FSDP2 reference policy (``grpo_dist.training.reference.FSDPReference``),
one per rank (:class:`~grpo_dist.workers.shell.ModelShell`).

``compute_ref_log_prob`` returns a :class:`~grpo_dist.workers.common.Timed` result (value and busy
seconds) for the driver's ``timing_s/ref/worker`` metric. ``wake_up``, ``load_bucket`` and
``finish_load`` take the actor's weights bucket by bucket (the rollout worker's weight-sync surface,
so :class:`grpo_dist.trainer.weight_sync.WeightSync` drives a reference reset as it drives a sync).
"""

from __future__ import annotations

import torch

from grpo_dist.workers.common import timed
from grpo_dist.workers.shell import ModelShell


class ReferenceWorker(ModelShell):
    role = "reference"
    model_class = "grpo_dist.training.reference:FSDPReference"

    def __init__(self, *, rank: int, world_size: int, device: str, num_threads: int,
                 external_libs: tuple[str, ...] = ()) -> None:
        super().__init__(rank=rank, world_size=world_size, device=device, num_threads=num_threads,
                         external_libs=external_libs)
        self._pending: dict[str, torch.Tensor] = {}  # a reset in progress: the weights received so far

    def build(self, cls: type, model_path: str, *, adapters_off_of: str | None = None, **kwargs) -> object:
        """The reference: its own FSDP2 model, or with ``adapters_off_of`` (LoRA) that role's model in this
        process with its adapters switched off (:class:`~grpo_dist.training.reference.AdapterOffReference`)."""
        if adapters_off_of is None:
            return super().build(cls, model_path, **kwargs)
        from grpo_dist.training.reference import AdapterOffReference
        from grpo_dist.training.settings import ReferenceSettings

        policy = self.peers.get(adapters_off_of)
        if policy is None or policy.model is None:
            raise RuntimeError(f"the reference is {adapters_off_of}'s base model, but this process holds no built "
                               f"{adapters_off_of} (roles: {sorted(self.peers)})")
        return AdapterOffReference(policy.model, ReferenceSettings(**kwargs))

    @timed
    def compute_ref_log_prob(self, data: dict[str, torch.Tensor], micro_batch_size: int | None,
                             max_token_len: int | None, temperature: float) -> torch.Tensor:
        return self.model.compute_ref_log_prob(data, micro_batch_size=micro_batch_size, max_token_len=max_token_len,
                                               temperature=temperature)

    @timed
    def wake_up(self) -> None:
        self._pending = {}

    @timed
    def load_bucket(self, bucket, payload) -> None:
        """One bucket of the policy's weights (object-store bytes or a CUDA IPC handle), copied."""
        import numpy as np

        from grpo_dist.rollout.weight_sync import bucket_buffer, open_cuda, unpack

        flat = bucket_buffer(bucket, payload) if isinstance(payload, np.ndarray) else open_cuda(payload)
        for name, view in unpack(bucket, flat):
            self._pending[name] = view.to("cpu", copy=True)
        if flat.is_cuda:
            torch.cuda.synchronize()

    @timed
    def finish_load(self) -> None:
        """Collective: the reference becomes the weights received since :meth:`wake_up`."""
        pending, self._pending = self._pending, {}
        self.model.load_full_weights(pending)
