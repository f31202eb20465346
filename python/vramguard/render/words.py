"""Counts and articles in English, one rule for every report.

    count(1, "block")          -> "1 block"
    count(3, "block")          -> "3 blocks"
    count(0, "range")          -> "0 ranges"
    count(2, "time", "times")  -> "2 times"
    count(1234, "tensor")      -> "1,234 tensors"
    a("8.00 GiB device")       -> "an 8.00 GiB device"
    a("L4")                    -> "an L4"
    a("T4")                    -> "a T4"

Every printed sentence with a count or an article goes through these, so
that "1 blocks" or "a 8.00 GiB device" cannot be printed anywhere.
"""
import re

__all__ = ["a", "and_list", "count", "plural"]

# Letters whose names begin with a vowel sound when read out ("an L4", "an H200",
# "an SXM card", "an 8 GB card"); "U" reads "you" ("a U-Net").
_VOWEL_SOUND_LETTERS = set("AEFHILMNORSX")
# Numbers whose reading begins with a vowel sound: 8, 11, 18, 80, 800..., 8000...
_EIGHT_OR_ELEVEN = re.compile(r"^(8|11|18)(\D|$)|^8\d")


def plural(n, singular, plural_form=None):
    """The word for `n` of a thing: `singular` for exactly 1, else the plural
    (`plural_form`, or `singular` + "s")."""
    if n == 1:
        return singular
    return plural_form if plural_form is not None else singular + "s"


def count(n, singular, plural_form=None):
    """"1 block", "0 blocks", "1,234 blocks": the number with thousands
    separators, then its word."""
    number = f"{n:,}" if isinstance(n, int) else str(n)
    return f"{number} {plural(n, singular, plural_form)}"


def _starts_with_vowel_sound(phrase):
    word = phrase.split(" ", 1)[0]
    if not word:
        return False
    if word[0].isdigit():
        return bool(_EIGHT_OR_ELEVEN.match(word.replace(",", "")))
    # An abbreviation or a card's name read letter by letter: "L4", "H200", "RTX", "SXM".
    letters = re.match(r"^[A-Z]+(?=[\d\-]|$)", word)
    if letters and (len(letters.group(0)) <= 4 or not word.isalpha()):
        return word[0] in _VOWEL_SOUND_LETTERS
    lower = word.lower()
    if lower.startswith(("one", "uni", "use", "usu", "eu", "ubi")):
        return False
    if lower.startswith(("hour", "honest", "honour", "heir")):
        return True
    return lower[0] in "aeiou"


def a(phrase):
    """`phrase` with "a" or "an" before it, by how it is read aloud."""
    return ("an " if _starts_with_vowel_sound(phrase) else "a ") + phrase


def and_list(items):
    """"a", "a and b", "a, b and c"."""
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
