"""Progress bars and status lines (effiformer.progress): the switch, log lines that do not break
a bar, status lines only for slow steps, and bars for evaluation."""

import logging
import threading

import torch

from effiformer import create_model
from effiformer.data import read_text
from effiformer.progress import (
    TqdmLoggingHandler,
    is_enabled,
    progress_bar,
    progress_enabled,
    status,
    track,
)
from effiformer.tasks import LMTask


def test_the_switch_nests_and_defaults_to_whether_stderr_is_a_terminal(capsys):
    assert is_enabled() is False  # captured stderr is no terminal
    with progress_enabled(True):
        assert is_enabled()
        with progress_enabled(False):
            assert not is_enabled()
            assert progress_bar(3).disable
        assert not progress_bar(3).disable
    assert is_enabled() is False
    seen = []

    def other_thread():
        seen.append(is_enabled())

    with progress_enabled(True):  # a context variable: another thread has its own default
        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
    assert seen == [False]


def test_a_log_line_written_while_a_bar_is_drawn_gets_a_line_of_its_own(capsys):
    log = logging.getLogger("effiformer.test_progress")
    log.propagate = False
    handler = TqdmLoggingHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        with progress_enabled(True):
            bar = progress_bar(10, desc="train", leave=True, mininterval=0)
            bar.update(5)
            log.info("hello")
            bar.update(5)
            bar.close()
    finally:
        log.removeHandler(handler)
    err = capsys.readouterr().err
    # tqdm.write clears the bar ("\r   \r"), prints the line and redraws the bar after it; a plain
    # stream handler would append "INFO ..." to the bar's line.
    lines = [segment.split("\r")[-1] for segment in err.split("\n")]
    assert "INFO effiformer.test_progress: hello" in lines, err


def test_status_lines_only_for_steps_that_take_a_while(caplog):
    caplog.set_level(logging.INFO, logger="effiformer")
    with status("quick step"):
        pass
    assert "quick step" not in caplog.text
    with status("slow step", after=0):
        pass
    assert "slow step ..." in caplog.text and "slow step: done in" in caplog.text


def test_track_ticks_and_closes_its_bar(capsys):
    with progress_enabled(True):
        assert list(track(range(4), desc="work")) == [0, 1, 2, 3]
        for i in track(range(10), desc="stopped"):
            if i == 2:
                break
    err = capsys.readouterr().err
    assert "work" in err and "stopped" in err
    assert err.endswith("\r")  # both bars closed (cleared: leave=False)


def test_lm_evaluation_draws_a_bar_only_when_progress_is_on(tmp_path, capsys):
    path = tmp_path / "t.txt"
    path.write_text("to be or not to be that is the question\n" * 40)
    task = LMTask(read_text(path), batch_size=2, seq_len=16, eval_batch_size=2)
    torch.manual_seed(0)
    model = create_model("vanilla-tiny")
    plain = task.evaluate(model, "valid")
    assert "eval valid" not in capsys.readouterr().err
    with progress_enabled(True):
        shown = task.evaluate(model, "valid")
    assert "eval valid" in capsys.readouterr().err
    assert shown == plain
