"""The merged weight of a LoRA-adapted linear layer.

A LoRA layer computes ``y = W x + s * B (A x)`` with ``W`` [out, in] frozen, ``A`` [r, in] and ``B``
[out, r] trained and ``s = alpha / r``. The same function as one plain weight::

    W' = W + s * (B @ A)                                   [out, in]

In half precision (float16 / bfloat16 ``W``) the product ``B @ A`` is formed in float32, scaled, and
cast to ``W``'s dtype before the sum (peft's ``merge_and_unload`` does the same, so the two agree to the
bit); in float32 everything stays float32.
"""

import torch

__all__ = ["merge_lora"]


def merge_lora(w_OI: torch.Tensor, a_RI: torch.Tensor, b_OR: torch.Tensor, scale: float) -> torch.Tensor:
    """``W + scale * (B @ A)`` (module docstring): ``w_OI`` [out, in], ``a_RI`` [r, in], ``b_OR`` [out, r];
    the result has ``w_OI``'s shape and dtype. ``ValueError`` when the shapes do not chain."""
    if a_RI.shape[1] != w_OI.shape[1] or b_OR.shape[0] != w_OI.shape[0] or b_OR.shape[1] != a_RI.shape[0]:
        raise ValueError(f"LoRA factors B {tuple(b_OR.shape)} @ A {tuple(a_RI.shape)} do not make a weight of "
                         f"shape {tuple(w_OI.shape)}")
    if w_OI.dtype in (torch.float16, torch.bfloat16):
        return w_OI + ((b_OR.float() @ a_RI.float()) * scale).to(w_OI.dtype)
    return w_OI + (b_OR @ a_RI) * scale
