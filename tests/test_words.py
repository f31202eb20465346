"""The one rule for counts and articles (render/words.py) that every report uses."""
import pytest

from vramguard.render.words import a, count, plural


@pytest.mark.parametrize("n, text", [(0, "0 blocks"), (1, "1 block"), (2, "2 blocks"), (1234, "1,234 blocks")])
def test_count_of_blocks(n, text):
    assert count(n, "block") == text


def test_irregular_plural():
    assert count(1, "time", "times") == "1 time"
    assert count(3, "entry", "entries") == "3 entries"
    assert plural(1, "entry", "entries") == "entry"


@pytest.mark.parametrize("phrase, text", [
    ("T4", "a T4"), ("L4", "an L4"), ("H200", "an H200"), ("A100-80GB", "an A100-80GB"),
    ("V100-16GB", "a V100-16GB"), ("RTX 3060", "an RTX 3060"), ("8.00 GiB device", "an 8.00 GiB device"),
    ("80 GiB card", "an 80 GiB card"), ("18 GiB card", "an 18 GiB card"), ("11 GB card", "an 11 GB card"),
    ("14.74 GiB device", "a 14.74 GiB device"), ("110 GiB card", "a 110 GiB card"),
    ("1.00 GiB tensor", "a 1.00 GiB tensor"), ("arena", "an arena"), ("unified range", "a unified range"),
    ("GPU", "a GPU"), ("hour", "an hour"), ("phantom T4", "a phantom T4"),
])
def test_article(phrase, text):
    assert a(phrase) == text
