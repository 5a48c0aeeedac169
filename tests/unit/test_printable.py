"""``jsonio.printable``: what the controller logs and stores of any text a user wrote."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from icefrog_slurm.jsonio import _printable, printable


def test_control_characters_and_lone_surrogates_are_written_out() -> None:
    assert printable("job\nname\x00") == "job\\x0aname\\x00"
    assert printable("bad\udcff byte") == "bad\\udcff byte"
    assert printable("\u202eevil") == "\\u202eevil"  # a bidi override is no printable text
    assert printable("ok text, ünïcode") == "ok text, ünïcode"


def test_a_long_text_is_cut_with_a_mark() -> None:
    assert printable("a" * 10, 5) == "aaaaa..."
    assert printable("a" * 5, 5) == "aaaaa"
    assert printable("\n" * 3, 8) == "\\x0a\\x0a..."


@given(st.text(st.characters(exclude_categories=())), st.integers(min_value=0, max_value=40))
def test_the_shortcut_for_plain_text_answers_as_the_character_walk(text: str, limit: int) -> None:
    assert printable(text, limit) == _printable(text, limit)
