"""Public out-of-memory reports rebuilt on the phantom GPU, figure by figure.

Reads the reports (reports.toml: facts copied from public pages) and our rebuilds
(rebuilds.toml: which script of rebuild/ stands for each report, with which
arguments, and which report fact or default each setting comes from), dry-runs
each rebuild on a phantom of the card's total as its message prints it, the CUDA
context set to what the message leaves beside PyTorch's cache (total - free -
allocated - reserved but unallocated) where it gives all four, and compares the
phantom's out-of-memory message with the report's: the failing request, allocated
at the failure, reserved but unallocated, and free.

    python bench/public_ooms/run.py                      # every rebuild; JSON and table under bench/results/
    python bench/public_ooms/run.py --only ID,ID --out DIR

Rows: bench/results/public-ooms-<torch>-<date>/rows.json (one per report, rebuilt or
not), table.md (the markdown table and its summary line).
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import messages  # noqa: E402

FIGURES = ("requested", "allocated", "reserved_unallocated", "free")
DAY_TORCH = "each report's own"  # rows.json's torch for the rows under the torch of their day


def load(path, key):
    """The entries of `key` in a TOML file; ValueError when an id is there twice, or when
    two entries quote the same message from the same page (one report under two ids)."""
    with open(path, "rb") as f:
        entries = tomllib.load(f).get(key, [])
    seen, quoted = set(), {}
    for entry in entries:
        if entry["id"] in seen:
            raise ValueError(f"{path}: {entry['id']} is there twice")
        seen.add(entry["id"])
        if key == "rebuild" and "rebuildable" in entry:
            raise ValueError(f"{path}: {entry['id']} is rebuilt: `rebuildable` belongs to [[not_rebuilt]] only")
        if "message" in entry:
            same = quoted.setdefault((entry.get("link"), " ".join(entry["message"].split())), entry["id"])
            if same != entry["id"]:
                raise ValueError(f"{path}: {entry['id']} is the report {same} again (same page, same message)")
    return entries


def real_figures(report):
    """The report's message, parsed; its figures as Size (None where not printed)."""
    msg = messages.parse_message(report["message"])
    return msg, figures(msg)


def figures(msg):
    """A parsed message's figures as Size (None where not printed). The old form (torch 2.0 and
    before, on a card or on a phantom running such a torch) gives reserved in total: its reserved
    but unallocated is derived, marked `*`."""
    unalloc = msg.reserved_unallocated
    if unalloc is None and msg.reserved_unallocated_bytes() is not None:
        # the old form's reserved in total less allocated, marked as derived
        unalloc = messages.Size(messages.format_size(msg.reserved_unallocated_bytes()) + "*",
                                msg.reserved_unallocated_bytes(), msg.allocated.unit)
    return {"requested": msg.requested, "allocated": msg.allocated, "reserved_unallocated": unalloc,
            "free": msg.free}


def dryrun_command(rebuild, msg, out_dir, python=sys.executable, day=False):
    """The dry run's command line and environment for one rebuild."""
    cmd = [python, "-m", "vramguard", "dryrun", "--gpu", rebuild["gpu"], "--memory", str(msg.total.bytes),
           "--allocators", rebuild.get("allocator", "native"), "--no-check-needs", "--no-snapshot",
           "--json", "--out", str(out_dir)]
    context = rebuild.get("context", "from message")
    if context == "from message":
        nonpt = msg.non_pytorch_bytes()
        if nonpt is None:
            raise ValueError(f"{rebuild['id']}: context 'from message', but the message lacks a figure")
        cmd += ["--context", str(nonpt)]
    elif context != "default":
        cmd += ["--context", str(context)]
    if rebuild.get("no_weights"):
        cmd.append("--no-weights")
    if rebuild.get("steps"):
        cmd += ["--steps", str(rebuild["steps"])]
    if rebuild.get("timeout"):
        cmd += ["--timeout", str(rebuild["timeout"])]
    args = [str(ROOT / x) if x.startswith("build/") else x for x in rebuild.get("args", [])]
    cmd += [str(HERE / "rebuild" / rebuild["script"]), *args]
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("VRAMGUARD_")}
    paths = [str(ROOT / "python")] + [str(ROOT / p) for p in libraries(rebuild, day)]
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if rebuild.get("alloc_conf"):
        env["PYTORCH_CUDA_ALLOC_CONF"] = rebuild["alloc_conf"]
    return cmd, env


def libraries(rebuild, day=False):
    """The folders a rebuild's libraries come from: under the torch of its report's day its
    `day_pythonpath` where it has one (the libraries of that day, installed for that torch), else
    its `pythonpath`."""
    return rebuild.get("day_pythonpath", rebuild.get("pythonpath", [])) if day else rebuild.get("pythonpath", [])


def run_rebuild(rebuild, report, out_dir, python=sys.executable, timeout=900, day=False):
    """Dry-runs one rebuild; returns the row comparing its figures with the report's."""
    msg, real = real_figures(report)
    if not day and rebuild.get("day_only"):  # a library the run needs has no build for this torch
        row = base_row(report, rebuild, real)
        row["phantom_error"] = f"not run under this torch: {rebuild['day_only']}"
        return row
    missing = [p for p in libraries(rebuild, day) + [a for a in rebuild.get("args", []) if a.startswith("build/")]
               if not (ROOT / p).exists()]
    if missing:
        row = base_row(report, rebuild, real)
        row["phantom_error"] = f"not fetched: {', '.join(missing)} (bench/public_ooms/deps.sh)"
        return row
    cmd, env = dryrun_command(rebuild, msg, out_dir, python, day)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=out_dir, timeout=timeout)
    row = base_row(report, rebuild, real)
    row["command"] = relative(" ".join(cmd[1:]))
    row["context_bytes"] = None
    try:
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        row["phantom_error"] = (proc.stderr or proc.stdout)[-2000:]
        return row
    run = result[rebuild.get("allocator", "native")]
    row["torch"] = result.get("torch")
    row["context_bytes"] = run.get("context_bytes")
    oom = run.get("first_oom") or {}
    row["peak_allocated_bytes"] = run.get("peak_allocated_bytes")
    if not oom.get("message"):
        peak = run.get("peak_allocated_bytes")
        row["phantom_error"] = run.get("error") or (
            f"fits: no out-of-memory, peak allocated {messages.format_size(peak)}" if run.get("fits") else "no OOM")
        return row
    row["oom_line"] = relative(oom.get("line"))
    try:
        phantom = messages.parse_message(oom["message"])
    except messages.MessageError as e:
        row["phantom_error"] = str(e)
        return row
    ph = figures(phantom)
    row["phantom"] = {name: ph[name].text for name in FIGURES}
    # the request is compared from its bytes (the memory history's), the rest from the message
    ph_bytes = {name: ph[name].bytes for name in FIGURES}
    ph_bytes["requested"] = oom.get("request_bytes") or ph_bytes["requested"]
    row["request_equal"] = messages.equal_at_precision(real["requested"], ph_bytes["requested"])
    for name in FIGURES:
        row[f"{name}_error"] = messages.signed_error(real[name], ph_bytes[name])
    return row


def refreshed(rows, report_ids, entries):
    """Rows measured before, as the corpus words them now: a report since removed dropped, each
    cause and `rebuildable` taken from its entry of rebuilds.toml (`entries`, by id; the figures
    are kept as measured)."""
    rows = [row for row in rows if row["id"] in report_ids]
    for row in rows:
        entry = entries.get(row["id"], {})
        row["cause"] = entry.get("cause", row.get("cause"))
        row["rebuildable"] = entry.get("rebuildable", True)
    return rows


def load_releases(path=HERE / "torch_releases.toml"):
    """PyTorch's releases, [(date, version)] in date order (torch_releases.toml: PyPI's upload days)."""
    with open(path, "rb") as f:
        return sorted((r["date"], r["version"]) for r in tomllib.load(f)["release"])


def torch_of_day(report, releases):
    """The torch a report ran, as far as it can be known: (version, basis). The one it names
    (its `torch_version` starting with a version), else the newest release uploaded on or before
    its date; (None, why) with neither."""
    named = re.match(r"(\d+\.\d+\.\d+)", report.get("torch_version", ""))
    if named:
        return named.group(1), "named by the report"
    date = str(report.get("date", ""))
    before = [v for d, v in releases if d <= date]
    if not date or not before:
        return None, "the report has no date" if not date else f"no release on or before {date}"
    return before[-1], f"the newest release on {date}"


def ran(row):
    """Whether a rebuild ran to its end under its torch: it reached an out-of-memory error, or
    fitted. A failure before that (a library missing for that torch, a stand-in it lacks) is not a
    run of the rebuild."""
    return bool(row.get("phantom")) or str(row.get("phantom_error") or "").startswith("fits:")


def combined(rows_215, rows_day):
    """Each report's row under the torch of its day where the phantom ran the rebuild under it,
    else its row under the default torch: the rows the combined summary counts."""
    day = {r["id"]: r for r in rows_day if ran(r)}
    return [day.get(r["id"], r) for r in rows_215]


def torch_version(python):
    """The torch version `python` imports; SystemExit with one line where it has none."""
    try:
        proc = subprocess.run([python, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                              text=True, timeout=120)
    except OSError as e:
        raise SystemExit(f"run.py: --python {python}: {e.strerror or e}") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"run.py: --python {python} cannot import torch: {last}")
    return proc.stdout.strip()


def relative(text):
    """Paths under the repository as the repository names them."""
    return text.replace(str(ROOT) + os.sep, "") if isinstance(text, str) else text


def base_row(report, rebuild, real):
    return {"id": report["id"], "link": report.get("link"), "card": report.get("card"),
            "total": report.get("card_total_from_message"), "torch_reported": report.get("torch_version"),
            "rebuilt": rebuild is not None, "rebuildable": True,
            "gpu": rebuild and rebuild.get("gpu"), "allocator": rebuild and rebuild.get("allocator", "native"),
            "alloc_conf": rebuild and rebuild.get("alloc_conf"),
            "script": rebuild and rebuild.get("script"), "args": rebuild and rebuild.get("args"),
            "basis": rebuild and rebuild.get("basis"),
            "real": {k: (v.text if v is not None else None) for k, v in real.items()},
            "phantom": None, "request_equal": None, "allocated_error": None,
            "cause": (rebuild or {}).get("cause")}


def not_rebuilt_row(report, entry):
    try:
        _, real = real_figures(report)
    except messages.MessageError:
        real = {k: None for k in FIGURES}
    row = base_row(report, None, real)
    row["cause"] = entry.get("cause") if entry else "no rebuild yet"
    row["rebuildable"] = entry.get("rebuildable", True) if entry else True
    return row


def pct(x):
    return "-" if x is None else f"{x * 100:+.2f}%"


def in_corpus(row):
    """A report that says enough to rebuild its run; one set aside (rebuildable = false) does not."""
    return row.get("rebuildable", True)


def summary(rows):
    """The summary line's figures. The shares are over the corpus (every report that says enough
    to rebuild its run, rebuilt or not: one not rebuilt, or not reaching an OOM, counts as a
    miss); the errors over the rebuilt rows that reached an OOM."""
    corpus = [r for r in rows if in_corpus(r)]
    compared = [r for r in corpus if r.get("phantom")]
    errors = [r["allocated_error"] for r in compared if r["allocated_error"] is not None]
    equal = sum(1 for r in compared if r["request_equal"])
    within = sum(1 for e in errors if abs(e) <= 0.02)
    worst = max(errors, key=abs) if errors else None
    return {"looked_at": len(rows), "set_aside": len(rows) - len(corpus), "reports": len(corpus),
            "rebuilt": sum(1 for r in corpus if r["rebuilt"]), "compared": len(compared),
            "request_equal": equal, "allocated_within_2pct": within,
            "allocated_median_abs_error": statistics.median(abs(e) for e in errors) if errors else None,
            "allocated_worst_error": worst}


def summary_line(s):
    n, r = s["reports"], s["rebuilt"]
    med = "-" if s["allocated_median_abs_error"] is None else f"{s['allocated_median_abs_error'] * 100:.2f}%"

    def share(k):
        return f"{k} of {n} ({k / max(n, 1) * 100:.0f}%)"

    aside = s.get("set_aside", 0)
    looked = (f"{s.get('looked_at', n)} reports looked at, {aside} set aside (the page does not say enough to "
              f"rebuild the run, or quotes the message short); " if aside else "")
    return (f"{looked}{n} in the corpus, {r} rebuilt, {s['compared']} of them reaching an out-of-memory error on "
            f"the phantom. Request equal at the printed precision: {share(s['request_equal'])}; allocated at the "
            f"failure within 2%: {share(s['allocated_within_2pct'])}; allocated at the failure over the "
            f"{s['compared']} compared: median absolute error {med}, worst {pct(s['allocated_worst_error'])}.")


def outcome(row):
    """A row's phantom run where it reached no out-of-memory error, in a few words."""
    error = (row.get("phantom_error") or "").strip()
    error = (error.splitlines()[-1] if error else "")[:100].replace("|", "/")
    if error.startswith("fits"):
        return error
    if row.get("peak_allocated_bytes"):
        return f"no OOM, stops at peak allocated {row['peak_allocated_bytes'] / 2**30:.2f} GiB: {error}"
    return "not run: " + error


def day_table(rows_default, rows_day):
    """The rows under the torch of their day beside the same reports' under the default torch:
    request and allocated at the failure, real / default / day's."""
    default = {r["id"]: r for r in rows_default}
    lines = ["| report | torch of its day | requested: real / 2.15 / its day's "
             "| allocated: real / 2.15 (error) / its day's (error) | reserved unallocated: real / its day's |",
             "|" + "---|" * 5]

    def request(row):
        ph = row.get("phantom")
        return ph["requested"] + (" (equal)" if row.get("request_equal") else " (differs)") if ph else outcome(row)

    def allocated(row):
        ph = row.get("phantom")
        return f"{ph['allocated']} ({pct(row.get('allocated_error'))})" if ph else "-"

    for r in rows_day:
        o = default[r["id"]]
        lines.append(f"| [{r['id']}]({r['link']}) | {r.get('torch') or r['torch_of_day']} ({r['torch_of_day_basis']}) "
                     f"| {r['real']['requested']} / {request(o)} / {request(r)} "
                     f"| {r['real']['allocated']} / {allocated(o)} / {allocated(r)} "
                     f"| {r['real']['reserved_unallocated'] or '-'} / {(r.get('phantom') or {}).get('reserved_unallocated', '-')} |")
    return "\n".join(lines)


def table(rows, show_torch=False):
    """The corpus's table, then the reports set aside, each with what its page does not say;
    `show_torch`: each row's torch in its settings (the rows under the torch of their day)."""
    text = corpus_table([r for r in rows if in_corpus(r)], show_torch)
    aside = [r for r in rows if not in_corpus(r)]
    if aside:
        text += ("\n\nSet aside, the page not saying enough to rebuild the run, or quoting the message short:\n\n"
                 + set_aside_table(aside))
    return text


def set_aside_table(rows):
    lines = ["| report | total | requested | allocated | what the page does not say |", "|" + "---|" * 5]
    for r in rows:
        cause = " ".join((r.get("cause") or "-").split()).replace("|", "/")
        lines.append(f"| [{r['id']}]({r['link']}) | {r['total']} | {r['real'].get('requested') or '-'} "
                     f"| {r['real'].get('allocated') or '-'} | {cause} |")
    return "\n".join(lines)


def corpus_table(rows, show_torch=False):
    head = ("| report | card (total), settings | requested: real / phantom | allocated: real / phantom (error) "
            "| reserved unallocated: real / phantom | free: real / phantom | cause of a difference over 2% |")
    lines = [head, "|" + "---|" * 7]
    for r in rows:
        real, ph = r["real"], r.get("phantom") or {}

        def cell(name, err=False):
            a, b = real.get(name) or "-", ph.get(name) or "-"
            text = f"{a} / {b}"
            if err and r.get(f"{name}_error") is not None:
                text += f" ({pct(r[f'{name}_error'])})"
            return text

        if r["rebuilt"]:
            settings = f"{r['total']} as {r['gpu']}, {r['allocator']}" + (
                f", {r['alloc_conf']}" if r.get("alloc_conf") else "") + f"; `{r['script']}`"
            if show_torch:
                settings += f"; torch {r.get('torch') or r.get('torch_of_day')} ({r.get('torch_of_day_basis')})"
        else:
            settings = f"{r['total']}; not rebuilt"
        req = cell("requested") + (" (equal)" if r.get("request_equal") else (" (differs)" if r.get("phantom")
                                                                              else ""))
        cause = r.get("cause") or "-"
        if r["rebuilt"] and not r.get("phantom"):
            cause = f"phantom: {r.get('phantom_error')}. " + (r.get("cause") or "")
        cause = " ".join(cause.split()).replace("|", "/")  # one line in the table's cell
        lines.append(f"| [{r['id']}]({r['link']}) | {settings} | {req} | {cell('allocated', True)} "
                     f"| {cell('reserved_unallocated')} | {cell('free')} | {cause} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reports", default=str(HERE / "reports.toml"))
    p.add_argument("--rebuilds", default=str(HERE / "rebuilds.toml"))
    p.add_argument("--only", default="", help="comma-separated report ids")
    p.add_argument("--out", default=None, help="default bench/results/public-ooms-<torch>-<date>")
    p.add_argument("--work", default=str(ROOT / "build" / "public-ooms"), help="the dry runs' folders")
    p.add_argument("--table-from", default=None, help="a rows.json written before: its table and summary again")
    p.add_argument("--python", default=sys.executable,
                   help="the interpreter whose torch the phantom runs (default this one): another torch's column")
    p.add_argument("--day-torch", action="store_true",
                   help="run only the reports whose torch of their day (torch_of_day) is --python's; "
                        "default folder bench/results/public-ooms-day-torch-<date>")
    p.add_argument("--combined", nargs=2, metavar=("ROWS", "DAY_ROWS"), default=None,
                   help="the summary of each report under its day's torch where run, else under ROWS' torch")
    p.add_argument("--update", action="store_true",
                   help="with --only and --out: replace those reports' rows in --out's rows.json, keep the others")
    args = p.parse_args(argv)
    if os.sep in args.python:  # the dry runs run in their own folders: a relative path from here
        args.python = os.path.abspath(args.python)  # (not resolved: a venv's python is a link)
    if args.table_from:  # the measured figures kept; the causes as rebuilds.toml now words them
        path = Path(args.table_from)
        data = json.loads(path.read_text())
        entries = {r["id"]: r for r in load(args.rebuilds, "rebuild") + load(args.rebuilds, "not_rebuilt")}
        data["rows"] = refreshed(data["rows"], {r["id"] for r in load(args.reports, "report")}, entries)
        for row in data["rows"]:
            for key in ("command", "oom_line", "phantom_error"):
                row[key] = relative(row.get(key))
        data["summary"] = summary(data["rows"])
        path.write_text(json.dumps(data, indent=1) + "\n")
        text = (table(data["rows"], show_torch=data.get("torch") == DAY_TORCH) + "\n\n"
                + summary_line(data["summary"]) + "\n")
        (path.parent / "table.md").write_text(text)
        print(text)
        return
    if args.combined:
        rows_215, rows_day = (json.loads(Path(p).read_text())["rows"] for p in args.combined)
        rows = combined(rows_215, rows_day)
        taken = [r for r, default in zip(rows, rows_215) if r is not default]
        print(day_table(rows_215, rows_day) + "\n")
        print(summary_line(summary(rows)))
        print(f"{len(taken)} of them under the torch of their day "
              f"({', '.join(sorted({r['torch_of_day'] for r in taken}))}).")
        return
    reports = load(args.reports, "report")
    rebuilds = {r["id"]: r for r in load(args.rebuilds, "rebuild")}
    full = torch_version(args.python)  # the version the phantom runs, for the folder's name, asked first
    releases = load_releases()
    unrebuilt = {r["id"]: r for r in load(args.rebuilds, "not_rebuilt")}
    only = {x for x in args.only.split(",") if x}
    work = Path(args.work).resolve()  # the dry runs run in it: their --out relative to it otherwise
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for report in reports:
        if only and report["id"] not in only:
            continue
        rebuild = rebuilds.get(report["id"])
        day, day_basis = torch_of_day(report, releases)
        if args.day_torch and (rebuild is None or day != full.split("+")[0]):
            continue
        if rebuild is None:
            rows.append(not_rebuilt_row(report, unrebuilt.get(report["id"])))
            continue
        print(f"{report['id']} ...", file=sys.stderr, flush=True)
        row = run_rebuild(rebuild, report, work, python=args.python, day=args.day_torch)
        row["torch_of_day"], row["torch_of_day_basis"] = day, day_basis
        print(f"  phantom {row.get('phantom') or row.get('phantom_error', '')[:300]}", file=sys.stderr)
        rows.append(row)
    version = full.split("+")[0]
    if args.day_torch and not rows:
        raise SystemExit(f"run.py: no rebuilt report's torch of its day is {version} (--python)")
    name = "day-torch" if args.day_torch else version
    out = Path(args.out or ROOT / "bench" / "results" / f"public-ooms-{name}-{datetime.date.today()}")
    out.mkdir(parents=True, exist_ok=True)
    if args.update and (out / "rows.json").exists():
        fresh = {r["id"]: r for r in rows}
        kept = json.loads((out / "rows.json").read_text())["rows"]
        rows = refreshed([fresh.pop(r["id"], r) for r in kept], {r["id"] for r in reports},
                         {**rebuilds, **unrebuilt}) + list(fresh.values())
    s = summary(rows)
    (out / "rows.json").write_text(json.dumps({"torch": DAY_TORCH if args.day_torch else full,
                                               "summary": s, "rows": rows}, indent=1) + "\n")
    text = table(rows, show_torch=args.day_torch) + "\n\n" + summary_line(s) + "\n"
    (out / "table.md").write_text(text)
    print(text)
    print(f"written: {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
