"""The trackers behind ``trainer.logger`` (verl's names), read back from what each one wrote: the
tensorboard event file, the wandb run file (offline mode), the mlflow store, metrics.jsonl and
val_generations.jsonl; and the choice of the validation samples they log (``log_val_generations``)."""

from __future__ import annotations

import glob
import importlib.util
import json
import struct
import time
from dataclasses import asdict

import numpy as np
import pytest

from grpo_dist.config.schema import ConfigError
from grpo_dist.config.validate import logger_names
from grpo_dist.trainer.metrics import pick_val_generations
from grpo_dist.trainer.tracking import GENERATIONS_FILE, Tracker, missing_backends, mlflow_key
from tests.configs import cfg_of


def needs(package: str):
    return pytest.mark.skipif(importlib.util.find_spec(package) is None,
                              reason=f"{package} is not installed (the [test] extra installs it)")


SAMPLES = [("abc", "cba", 1.0), ("hello | world", "line1\nline2", 0.25)]


# ------------------------------------------------------------------------------ names and packages
@pytest.mark.parametrize("value,names", [
    ("trainer.logger=console", ["console"]),  # verl's scripts write a plain string
    ('trainer.logger=["console","wandb"]', ["console", "wandb"]),
    ("trainer.logger=[console,file,tensorboard,mlflow]", ["console", "file", "tensorboard", "mlflow"]),
])
def test_logger_takes_verls_spellings(value, names):
    assert logger_names(cfg_of(value).trainer.logger) == names


@pytest.mark.parametrize("value,needle", [
    ("trainer.logger=[console,swanlab]", "swanlab backend is not built into grpo_dist"),
    ("trainer.logger=neptune", "expected one of console, file, tensorboard, wandb, mlflow"),
])
def test_unknown_loggers_are_refused(value, needle):
    with pytest.raises(ConfigError, match=needle):
        cfg_of(value)


def test_missing_backend_packages_are_named(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("mlflow", "wandb") else real(name, *a))
    msg = missing_backends(["console", "wandb", "mlflow", "file"])
    assert "'wandb', 'mlflow'" in msg and "pip install wandb mlflow-skinny" in msg
    assert missing_backends(["console", "file"]) is None


# ------------------------------------------------------------------------------ the sample choice
def test_val_generations_are_verls_fixed_seed_choice():
    inputs = [f"q{i}" for i in range(20)]
    outputs = [f"a{i}" for i in range(20)]
    scores = [i / 20 for i in range(20)]
    got = pick_val_generations(inputs, outputs, scores, 5)
    # verl's recipe, written out: sort the (input, output, score) triples, shuffle with RandomState(42), keep n
    ref = sorted(zip(inputs, outputs, scores))
    np.random.RandomState(42).shuffle(ref)
    assert got == ref[:5]
    # the same choice whatever order the responses came back in; never more than there are
    perm = np.random.default_rng(0).permutation(20)
    assert pick_val_generations([inputs[i] for i in perm], [outputs[i] for i in perm], [scores[i] for i in perm], 5) == got
    assert len(pick_val_generations(inputs, outputs, scores, 50)) == 20
    assert pick_val_generations(inputs, outputs, scores, 0) == []


# ------------------------------------------------------------------------------ file and console
def test_file_logger_writes_generations_and_trims_them_on_resume(tmp_path, capsys):
    tr = Tracker(["console", "file"], out_dir=tmp_path, project="p", experiment="e", config={})
    for step in (0, 2, 4):
        tr.log_generations(SAMPLES, step=step)
    tr.close()
    rows = [json.loads(line) for line in (tmp_path / GENERATIONS_FILE).read_text().splitlines()]
    assert [(r["step"], r["index"]) for r in rows] == [(0, 0), (0, 1), (2, 0), (2, 1), (4, 0), (4, 1)]
    assert rows[1] == {"step": 0, "index": 1, "input": "hello | world", "output": "line1\nline2", "score": 0.25}
    out = capsys.readouterr().out
    assert "validation generations at step 4 (2 sample(s))" in out and "abc -> cba" in out and "line1\\nline2" in out
    Tracker(["file"], out_dir=tmp_path, project="p", experiment="e", config={}, resume_step=2).close()
    assert sorted({json.loads(line)["step"] for line in (tmp_path / GENERATIONS_FILE).read_text().splitlines()}) == [0, 2]


# ------------------------------------------------------------------------------ tensorboard
@needs("tensorboard")
def test_tensorboard_event_file_holds_the_metrics_and_the_table(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tr = Tracker(["tensorboard"], out_dir=tmp_path, project="p", experiment="e", config={})
    tr.log({"actor/pg_loss": 0.5, "val-core/x/acc/mean@1": 0.25}, step=1)
    tr.log({"actor/pg_loss": -1.5}, step=2)
    tr.log_generations(SAMPLES, step=2)
    tr.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("actor/pg_loss")] == [(1, 0.5), (2, -1.5)]
    assert [(e.step, e.value) for e in acc.Scalars("val-core/x/acc/mean@1")] == [(1, 0.25)]
    assert "time/unix" not in acc.Tags()["scalars"]
    (text,) = acc.Tensors("val/generations/text_summary")
    table = text.tensor_proto.string_val[0].decode()
    assert text.step == 2 and "| 1 | abc | cba | 1 |" in table and "hello \\| world" in table and "line1<br>line2" in table


# ------------------------------------------------------------------------------ wandb (offline)
def read_wandb_records(run_file: str) -> list:
    """The records of a wandb run file: a LevelDB-style log (7-byte header ':W&B' + magic + version; 32 KiB
    blocks of chunks, each with a 7-byte header: crc32, length, type full/first/middle/last) of protobufs."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = open(run_file, "rb").read()
    ident, magic, _ = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B" and magic == 0xBEE1
    block, pos, pending, records = 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pos += 7
        if pos + length > len(data):  # the writer is still writing this chunk: read what is whole
            break
        chunk, pos = data[pos:pos + length], pos + length
        if kind == 1:
            records.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            records.append(pending + chunk)
    out = []
    for raw in records:
        rec = pb.Record()
        rec.ParseFromString(raw)
        out.append(rec)
    return out


@needs("wandb")
def test_wandb_offline_run_gets_the_resolved_config_metrics_and_table(tmp_path, monkeypatch):
    from google.protobuf.message import DecodeError

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    cfg = cfg_of("trainer.logger=[console,wandb]", "data.max_response_length=17", "trainer.project_name=proj",
                 "trainer.experiment_name=exp")
    tr = Tracker(["wandb"], out_dir=tmp_path, project="proj", experiment="exp", config=asdict(cfg))
    tr.log({"actor/pg_loss": 0.5}, step=1)
    tr.log_generations(SAMPLES, step=1)
    tr.log({"actor/pg_loss": 0.75}, step=2)
    tr.close()
    (run_file,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))  # under default_local_dir
    deadline = time.time() + 30  # wandb's service process may still be writing the file when finish() returns
    while True:
        try:
            records = read_wandb_records(run_file)
        except DecodeError:  # a record the service process had not finished writing
            if time.time() > deadline:
                raise
            time.sleep(0.2)
            continue
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.time() > deadline:
            break
        time.sleep(0.2)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.project == "proj" and run.display_name == "exp"
    config = {i.key: json.loads(i.value_json) for i in run.config.update}
    config.update({i.key: json.loads(i.value_json) for r in records if r.WhichOneof("record_type") == "config"
                   for i in r.config.update})
    # the resolved configuration, interpolations included (response_length follows data.max_response_length)
    assert config["actor_rollout_ref"]["rollout"]["response_length"] == 17
    assert config["trainer"]["logger"] == ["console", "wandb"]
    history = [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]
    losses = [(h["_step"], h["actor/pg_loss"]) for h in history if "actor/pg_loss" in h]
    assert losses == [(1, 0.5), (2, 0.75)]
    table_rows = [h for h in history if "val/generations/_type" in h]
    assert table_rows and table_rows[0]["val/generations/_type"] == "table-file"
    (table_file,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "files" / "media" / "table" / "val" / "*.table.json"))
    table = json.loads(open(table_file).read())
    assert table["columns"] == ["step", "input_1", "output_1", "score_1", "input_2", "output_2", "score_2"]
    assert table["data"] == [[1, "abc", "cba", 1.0, "hello | world", "line1\nline2", 0.25]]


# ------------------------------------------------------------------------------ mlflow
@needs("mlflow")
def test_mlflow_gets_params_metrics_and_the_table(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = cfg_of("trainer.logger=[console,mlflow]", "trainer.seed=7")
    tr = Tracker(["mlflow"], out_dir=tmp_path, project="proj", experiment="exp", config=asdict(cfg))
    tr.log({"val-core/x/acc/mean@1": 0.5, "actor/pg_loss": 1.0}, step=3)
    tr.log_generations(SAMPLES, step=3)
    run_id = tr.loggers[0].run.info.run_id
    uri = tr.loggers[0].mlflow.get_tracking_uri()
    tr.close()
    from mlflow.tracking import MlflowClient

    assert str(tmp_path) in uri  # stored beside the run's metrics when MLFLOW_TRACKING_URI is unset
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.data.params["trainer/seed"] == "7" and run.info.run_name == "exp"
    assert run.data.params["trainer/logger"] == '["console", "mlflow"]'
    hist = client.get_metric_history(run_id, "val-core/x/acc/mean_at_1")
    assert [(m.step, m.value) for m in hist] == [(3, 0.5)]
    local = client.download_artifacts(run_id, "val_generations/val_step3.json", str(tmp_path / "dl"))
    assert json.loads(open(local).read())["samples"][1] == {"input": "hello | world", "output": "line1\nline2", "score": 0.25}


def test_mlflow_metric_names():
    assert mlflow_key("val-core/gsm8k/acc/mean@4") == "val-core/gsm8k/acc/mean_at_4"
    assert mlflow_key("timing_s/update_weights/gather") == "timing_s/update_weights/gather"
    assert mlflow_key("a(b)") == "a_b_"
