"""service/playback.py: an interrupted turn's transcript cut to the part of its audio heard."""

from __future__ import annotations

from service.playback import CUT_MARK, heard_text

TEXT = "one two three four five six seven eight nine ten"


def test_the_heard_part_is_the_words_of_that_part_of_the_audio():
    assert heard_text(TEXT, 0.3) == "one two three" + CUT_MARK
    assert heard_text(TEXT, 0.34) == "one two three" + CUT_MARK
    assert heard_text(TEXT, 0.36) == "one two three four" + CUT_MARK


def test_a_turn_heard_in_full_or_of_unknown_playback_is_kept_whole():
    for fraction in (None, 1.0, 1.5, 0.99):
        assert heard_text(TEXT, fraction) == TEXT


def test_a_turn_cut_before_its_first_word_is_empty():
    assert heard_text(TEXT, 0.0) == ""
    assert heard_text(TEXT, -0.2) == ""
    assert heard_text("   ", 0.5) == "   "
