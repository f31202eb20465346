"""Leak: what vramguard.leak_check() returns, and what the out-of-memory
report quotes, when the step boundaries show a leak (leak_rule.py), with
its text and HTML."""
import html

from .._units import format_size
from ..render import words

__all__ = ["Leak"]


class Leak:
    """Memory live at step boundaries that keeps growing.

    bytes_per_step: the median increment over the last LEAK_WINDOW
    boundaries; since_step: the step from which the boundaries grew (the
    earliest that keeps the rule true); accumulated: bytes live at the last
    boundary beyond those at since_step; lines: [(label, bytes grown,
    blocks grown)] of the lines that allocated what accumulates (stacks
    recorded), else None."""

    CAUSES = (
        "a tensor kept across steps, such as losses.append(loss) (keep loss.item() instead, a float)",
        "outputs or activations kept in a list or a dict across steps (detach() and .cpu(), or drop them)",
        "a growing cache keyed by step (hidden states, attention masks)",
    )

    def __init__(self, bytes_per_step, since_step, steps, accumulated, live, lines=None, lines_note=None,
                 lines_since=None):
        self.bytes_per_step = bytes_per_step
        self.since_step = since_step
        self.steps = steps
        self.accumulated = accumulated
        self.live = live
        self.lines = lines
        self.lines_note = lines_note
        # the step boundary the lines' growth is counted from (stacks are
        # compared from where they were first kept, which may be later than
        # since_step): the lines' figures cover lines_since to steps only
        self.lines_since = lines_since

    def _lines_title(self):
        if self.lines and self.lines_since is not None:
            return f"What accumulates, by line (from step {self.lines_since} to step {self.steps}):"
        return "What accumulates, by line:"

    def headline(self):
        return (f"Leak: memory live at step boundaries grows by {format_size(self.bytes_per_step)} per step "
                f"(since step {self.since_step}, {format_size(self.accumulated)} so far; "
                f"{format_size(self.live)} live at step {self.steps}).")

    def _line_texts(self):
        if self.lines:
            return [f"{label}: +{format_size(nbytes)} in {words.count(blocks, 'block')}" for label, nbytes, blocks in self.lines]
        return [self.lines_note or "vramguard.record(stacks=True) shows which lines allocate it."]

    def __str__(self):
        out = [self.headline(), self._lines_title()]
        out += ["  " + t for t in self._line_texts()]
        out.append("Usual causes:")
        out += ["  - " + c for c in self.CAUSES]
        return "\n".join(out)

    def __repr__(self):
        return str(self)

    def _repr_html_(self):
        lines = "".join(f"<li>{html.escape(t)}</li>" for t in self._line_texts())
        causes = "".join(f"<li>{html.escape(c)}</li>" for c in self.CAUSES)
        return (f"<p><b>{html.escape(self.headline())}</b></p><p>{html.escape(self._lines_title())}</p><ul>{lines}</ul>"
                f"<p>Usual causes:</p><ul>{causes}</ul>")
