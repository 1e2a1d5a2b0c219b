"""The service's own view of the bot's speech (service/speech.py): when a transport stop is
the end of the bot's speech, and what a reconnect that cut a turn does to the count."""

from __future__ import annotations

from service.speech import SpeechTracker


def test_a_stop_ends_the_speech_only_once_every_turn_begun_was_played():
    speech = SpeechTracker("transport", 4.0)
    speech.turn_began()
    speech.turn_began()  # the next turn's audio queued behind the first
    assert speech.transport_started()
    assert not speech.transport_stopped()  # the first turn's playback ended: not silence
    assert speech.transport_started()
    assert speech.transport_stopped()


def test_an_interruption_drops_the_queued_turns():
    speech = SpeechTracker("transport", 4.0)
    speech.turn_began()
    speech.turn_began()
    speech.interrupted()
    speech.transport_started()
    assert speech.transport_stopped()


def test_a_turn_cut_by_a_reconnect_is_played_with_the_next_one_in_one_stretch():
    speech = SpeechTracker("transport", 4.0)
    speech.turn_began()
    speech.transport_started()
    speech.session_replaced(turn_cut=True)
    speech.turn_began()  # the new session's first turn
    assert speech.old_playback_is_speech
    assert speech.transport_stopped()  # one stop stands for both turns


def test_in_model_mode_the_transport_only_holds_the_watchdog_off():
    speech = SpeechTracker("model", 4.0)
    speech.turn_began()
    assert not speech.transport_started()
    assert speech.transport_speaking and not speech.old_playback_is_speech
    assert not speech.transport_stopped()
    assert not speech.transport_speaking


def test_a_model_turn_is_under_way_from_its_output_to_its_end():
    speech = SpeechTracker("transport", 4.0)
    speech.server_content(turn_complete=False, interrupted=False, output=True)
    assert speech.model_generating
    speech.server_content(turn_complete=True, interrupted=False, output=False)
    assert not speech.model_generating
    speech.server_content(turn_complete=False, interrupted=False, output=True)
    speech.session_ready()
    assert not speech.model_generating
