"""A budget typed above zero that rounds down to 0 bytes ("0.5" on the
command line, Heap(budget=0.5)) is too small, not "must be positive"."""
import pytest

from vramguard import parse_budget


@pytest.mark.parametrize("value, typed", [("0.5", "0.5"), ("1e-30", "1e-30"), (0.5, "0.5"), (" 0.25 ", "0.25")])
def test_a_fraction_of_a_byte_asks_for_a_unit(value, typed):
    with pytest.raises(ValueError) as info:
        parse_budget(value)
    assert str(info.value) == (
        f"a budget of {typed} bytes is smaller than one 2 MiB segment: give a unit, e.g. '{typed}GiB'")


@pytest.mark.parametrize("value", ["0", 0, "0.0", 0.0, "0e5"])
def test_zero_is_still_not_positive(value):
    with pytest.raises(ValueError, match="must be positive"):
        parse_budget(value)


def test_below_a_byte_with_a_unit_names_what_was_typed():
    with pytest.raises(ValueError) as info:
        parse_budget("0.0001B")
    assert str(info.value) == ("a budget of '0.0001B' (0 bytes) is smaller than one 2 MiB segment, "
                               "the least any allocation reserves")
