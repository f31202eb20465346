"""A table as monospaced text: a header, a rule of dashes, one line per
row; each column as wide as its widest cell, numbers right-aligned and the
columns of words (`left`) left-aligned. The dry run's table, the table of
the rows that ended when a dry run is cut short, and the remedies' table
are all drawn here."""

__all__ = ["text_table"]


def text_table(headers, rows, left=(0,)):
    """The lines of the table; `left`: the indices (negative ones count from
    the end) of the columns aligned left."""
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows)]
    lefts = {i % len(widths) for i in left}
    lines = []
    for i, row in enumerate([headers] + list(rows)):
        cells = [str(c).ljust(w) if j in lefts else str(c).rjust(w) for j, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines
