"""The benchmarks' refusal to measure on a loaded machine (``bench/load.py``)."""

import argparse

import pytest

from bench.load import Rounds, add_load_arguments, load_note, require_quiet


def options(*argv):
    parser = argparse.ArgumentParser()
    add_load_arguments(parser)
    return parser.parse_args(list(argv))


def loads(*figures):
    """A load average that reads ``figures`` one after another, then the last one for ever."""
    seen = list(figures)
    return lambda: seen.pop(0) if len(seen) > 1 else seen[0]


def test_a_quiet_machine_is_measured_at_once(capsys):
    slept = []
    require_quiet(options(), load=loads(0.4), sleep=slept.append)
    assert slept == []
    assert "load 0.40 at the start" in capsys.readouterr().out


def test_a_busy_machine_is_waited_for_until_it_is_quiet(capsys):
    slept = []
    require_quiet(options(), load=loads(6.0, 3.1, 1.9), sleep=slept.append)
    assert slept == [5.0, 5.0]
    out = capsys.readouterr().out
    assert "load 6.00 is above 2: waiting" in out
    assert "load 1.90 at the start" in out


def test_a_machine_that_stays_busy_is_refused_with_its_load():
    slept = []
    with pytest.raises(SystemExit) as refused:
        require_quiet(options("--load-wait", "20"), load=loads(7.5), sleep=slept.append)
    assert len(slept) == 4
    assert "load 7.50 is still above 2 after 20 s: refusing to measure" in str(refused.value.code)


def test_allow_load_measures_anyway_and_says_the_figures_do_not_count(capsys):
    require_quiet(options("--allow-load", "--load-wait", "0"), load=loads(9.0), sleep=print)
    assert (
        "load 9.00: measured anyway (--allow-load); these figures do not count"
        in capsys.readouterr().out
    )


def test_each_round_above_the_limit_is_flagged():
    assert load_note(lambda: 0.5) == "load 0.50"
    assert load_note(lambda: 2.5) == "load 2.50 (above 2: this round does not count)"


def test_a_summary_is_taken_over_the_rounds_that_count():
    rounds = Rounds(load=loads(0.8, 2.4, 1.2))
    notes = [rounds.start() for _ in range(3)]

    assert notes[1] == "load 2.40 (above 2: this round does not count)"
    assert rounds.kept([10, 99, 30]) == [10, 30]
    assert rounds.note() == "2 of 3 rounds (the others began above load 2)"


def test_every_round_counting_is_said_plainly():
    rounds = Rounds(load=loads(0.5))
    for _ in range(2):
        rounds.start()

    assert rounds.kept(["a", "b"]) == ["a", "b"]
    assert rounds.note() == "2 rounds"


def test_when_no_round_counts_the_summary_keeps_them_all_and_says_it_does_not_count():
    rounds = Rounds(load=loads(3.0))
    for _ in range(2):
        rounds.start()

    assert rounds.kept([1.0, 2.0]) == [1.0, 2.0]
    assert rounds.note() == "2 rounds, none of which counts (begun above load 2)"


def test_a_figure_for_each_round_started_or_none_is_kept():
    rounds = Rounds(load=loads(0.5))
    rounds.start()

    with pytest.raises(ValueError, match="2 figures for 1 rounds"):
        rounds.kept([1.0, 2.0])
    assert rounds.note() == "1 round"
