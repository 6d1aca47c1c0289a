"""The parts of an event's fingerprint that mask the call's own words in its output."""

from __future__ import annotations

from shared.stagnation.fingerprint import without_echo

ARGUMENTS = {"pattern": "install JDK", "path": "build.gradle"}


def test_a_failed_short_output_has_every_argument_word_masked() -> None:
    text = 'No matches found for "install JDK" in build.gradle'
    assert without_echo(text, ARGUMENTS) == 'No matches found for "<arg>" in <arg>'


def test_a_successful_output_has_only_its_quoted_echoes_masked() -> None:
    quoted = 'No matches found for "install JDK" in build.gradle'
    assert without_echo(quoted, ARGUMENTS, failed=False) == (
        'No matches found for "<arg>" in build.gradle'
    )
    single = "No matches found for 'build.gradle'"
    assert without_echo(single, ARGUMENTS, failed=False) == "No matches found for '<arg>'"


def test_a_successful_output_without_a_quote_is_returned_as_it_is() -> None:
    text = "install JDK: found in build.gradle"
    assert without_echo(text, ARGUMENTS, failed=False) is text


def test_a_long_output_is_never_touched() -> None:
    text = "install JDK\n" * 5
    assert without_echo(text, ARGUMENTS) is text
