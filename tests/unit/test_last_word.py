"""A failed run's message is printed after Ray and the workers are shut down (their late log lines
come before it), and still printed, once, when shutting down hangs."""

from __future__ import annotations

import time

from grpo_dist.trainer import run as run_mod
from grpo_dist.trainer.run import LastWord


def test_the_message_comes_after_the_cleanup_and_once(capsys):
    word = LastWord()
    word.set("actor worker rank 1 failed during update_policy", 1)
    assert word and word.code == 1
    word.start_clock()
    print("(RolloutWorker pid=1) a late log line", flush=True)  # what Ray forwards while shutting down
    word.say_now()
    word.say_now()
    out = capsys.readouterr()
    assert out.err == "grpo_dist: error: actor worker rank 1 failed during update_policy\n"
    assert "late log line" in out.out


def test_a_hung_shutdown_does_not_hide_the_message(capsys, monkeypatch):
    monkeypatch.setattr(run_mod, "LAST_WORD_WAIT_S", 0.2)
    word = LastWord()
    word.set("stopped on SIGTERM", 143)
    word.start_clock()
    time.sleep(1.0)  # closing the workers takes longer than allowed
    assert capsys.readouterr().err == "grpo_dist: error: stopped on SIGTERM\n"
    word.say_now()  # closing ends after all: nothing more is printed
    assert capsys.readouterr().err == ""


def test_nothing_is_said_when_the_run_did_not_fail(capsys):
    word = LastWord()
    assert not word
    word.start_clock()
    word.say_now()
    assert capsys.readouterr().err == ""
