"""gpu/stopping.py: which stop string ended the text (DONE's stop_index, Anthropic's
stop_sequence), when several could."""
from __future__ import annotations

from zerolayer.gpu.stopping import StopChecker


def test_the_earliest_match_wins_across_chunks():
    c = StopChecker(["zz", "b", "ab"])
    assert c.push("xxa") == "xx"          # "a" could start "ab": held back
    assert c.push("bc") == "" and c.stopped and c.matched == "ab"


def test_at_one_position_the_first_stop_string_in_request_order():
    c = StopChecker(["abc", "ab"])
    assert c.push("xabcd") == "x" and c.matched == "abc"
    c = StopChecker(["ab", "abc"])
    assert c.push("xabcd") == "x" and c.matched == "ab"


def test_no_match_leaves_it_unset():
    c = StopChecker(["q"])
    assert c.push("hello") == "hello" and not c.stopped and c.matched is None
