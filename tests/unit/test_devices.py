"""utils/devices.cuda_available: torch's answer, without importing torch where no GPU driver is installed."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import torch

from grpo_dist.utils import devices


def test_it_is_torch_s_answer_once_torch_is_imported(monkeypatch):
    monkeypatch.setattr(devices, "DEVICE_FILES", ())  # no device file, but torch is imported: it is asked
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert devices.cuda_available() is True
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert devices.cuda_available() is False


def test_without_a_gpu_driver_s_device_file_it_answers_without_importing_torch():
    probe = textwrap.dedent("""
        import sys
        from grpo_dist.utils import devices
        devices.DEVICE_FILES = ("/nonexistent/nvidiactl",)  # a machine without NVIDIA, ROCm or WSL GPU devices
        print(devices.cuda_available(), "torch" in sys.modules)
        devices.DEVICE_FILES = (sys.executable,)  # a file that exists stands for a driver's: torch is asked
        print(devices.cuda_available() in (True, False), "torch" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:2] == ["False False", "True True"]
