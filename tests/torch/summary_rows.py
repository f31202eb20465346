"""The summary table's rows as one string each: a row wider than the table
wraps onto indented rows of its own (render/summary.py), joined here again.
Rules (|---|, |===|) are left out. No imports: the truth harness uses it
inside a scenario's kernel, the tests in their own process."""


def summary_rows(text):
    rows = []
    for line in text.splitlines():
        if not line.startswith("| "):
            continue
        content = line[2:-2].rstrip()
        if content.startswith("  ") and rows and not rows[-1].startswith("Metric"):
            rows[-1] += " " + content.strip()
        else:
            rows.append(content.strip())
    return rows
