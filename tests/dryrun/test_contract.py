"""The contract between a dry run's child and its parent
(python/vramguard/dryrun/contract.py): every field the child fills is one
the parent reads, or one kept for the user's JSON only; a record written is
the record read; a record of another format or version, or with a field
this version does not know, is refused, and its run is said to have left
no figures. Read from the source with ast where the question is what the
code does with a field, not what one run happens to fill."""
import ast
import dataclasses
import json
from pathlib import Path

import pytest

from vramguard.dryrun import contract
from vramguard.dryrun.contract import FirstOom, RunRecord, read_run, write_run

PACKAGE = Path(contract.__file__).resolve().parents[1]
DRYRUN = PACKAGE / "dryrun"
CHILD = DRYRUN / "child"


def _trees(paths):
    return [(p, ast.parse(p.read_text(encoding="utf-8"), str(p))) for p in paths]


def _child_writes():
    """The RunRecord fields the child fills: the keywords of its RunRecord(...)
    and dataclasses.replace(...) calls, the fields it assigns on a record,
    and the keys the features' figures() return."""
    written = set()
    for path, tree in _trees(sorted(CHILD.glob("*.py"))):
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in ("RunRecord", "replace"):
                    written |= {k.arg for k in node.keywords if k.arg}
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Attribute) and getattr(target.value, "id", None) == "record":
                        written.add(target.attr)
    for path, tree in _trees(sorted((DRYRUN / "features").glob("*.py"))):
        features = [c for c in ast.walk(tree) if isinstance(c, ast.ClassDef)
                    and any(getattr(b, "id", None) == "Feature" for b in c.bases)]
        for cls in features:
            for node in cls.body:
                if isinstance(node, ast.FunctionDef) and node.name == "figures":
                    for ret in ast.walk(node):
                        if isinstance(ret, ast.Return) and isinstance(ret.value, ast.Dict):
                            written |= {k.value for k in ret.value.keys if isinstance(k, ast.Constant)}
    return written


def _parent_reads():
    """String keys the code above the child reads: run.get("key"),
    run["key"], r.key on a record; everywhere in the package but the
    child and the contract itself."""
    read = set()
    paths = [p for p in sorted(PACKAGE.rglob("*.py"))
             if CHILD not in p.parents and p.name != "contract.py" and "_phantom_src" not in p.parts]
    for path, tree in _trees(paths):
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in ("get", "pop", "setdefault") \
                    and node.args and isinstance(node.args[0], ast.Constant):
                read.add(node.args[0].value)
            elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                read.add(node.slice.value)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                read.add(node.attr)
            elif isinstance(node, ast.For) and isinstance(node.iter, (ast.Tuple, ast.List)):
                read |= {e.value for e in node.iter.elts if isinstance(e, ast.Constant)}  # for key in ("a", "b")
    return read


def test_every_field_is_filled_by_the_child():
    unfilled = set(contract.field_names()) - _child_writes() - {"allocator", "partial"}
    # allocator: RunRecord's one required field; partial: set by write_progress's replace
    assert unfilled == set()
    assert "partial" in _child_writes() and "ended_at" in _child_writes()


def test_every_field_the_child_writes_is_one_the_record_declares():
    assert _child_writes() - set(contract.field_names()) == set()


def test_every_field_written_is_read_by_the_parent_or_kept_for_the_user():
    unread = set(contract.field_names()) - _parent_reads() - contract.for_users_fields()
    assert unread == set()


def _record(**fields):
    return RunRecord(allocator="native", peak_allocated_bytes=3 << 20, peak_reserved_bytes=4 << 20, fits=False,
                     first_oom=FirstOom(line="train.py:12", request_bytes=1 << 20, message="CUDA out of memory",
                                        caught=True, inner_line=None),
                     compiled={"torch_compile": False, "triton": False}, optimizers=["AdamW"], **fields)


def test_a_record_written_is_the_record_read(tmp_path):
    record = _record(extensions={"bitsandbytes": {"kernels": 2, "launches": 40}}, partial=True)
    write_run(tmp_path / "r.json", record)
    assert read_run(tmp_path / "r.json") == record
    data = json.loads((tmp_path / "r.json").read_text())
    assert (data["format"], data["version"]) == (contract.FORMAT, contract.VERSION)
    assert list(tmp_path.iterdir()) == [tmp_path / "r.json"]  # no temporary file left beside it


def test_the_run_dict_is_the_public_json():
    run = _record().to_run()
    assert run["first_oom"] == {"line": "train.py:12", "request_bytes": 1 << 20, "message": "CUDA out of memory",
                                "caught": True, "inner_line": None}
    assert set(run) == set(contract.field_names())


@pytest.mark.parametrize("change, said", [
    (lambda d: d.update(version=contract.VERSION + 1), "a record of version 2, not 1: written by another vramguard"),
    (lambda d: d.update(format="something else"), "not a dry run's record"),
    (lambda d: d.pop("format"), "not a dry run's record"),
    (lambda d: d.update(new_figure=1, other=2), "fields this vramguard does not know: new_figure, other"),
])
def test_a_record_of_another_kind_is_refused(tmp_path, change, said):
    write_run(tmp_path / "r.json", _record())
    data = json.loads((tmp_path / "r.json").read_text())
    change(data)
    (tmp_path / "r.json").write_text(json.dumps(data))
    with pytest.raises(ValueError) as refused:
        read_run(tmp_path / "r.json")
    assert str(refused.value) == f"{tmp_path / 'r.json'}: {said}"


@pytest.mark.parametrize("text", ["", "{", "[]", "null", '"a string"'])
def test_a_record_that_is_not_whole_json_is_refused(tmp_path, text):
    (tmp_path / "r.json").write_text(text)
    with pytest.raises(ValueError):
        read_run(tmp_path / "r.json")


def test_a_missing_record_is_an_os_error(tmp_path):
    with pytest.raises(OSError):
        read_run(tmp_path / "none.json")


def test_a_run_whose_record_is_refused_left_no_figures(tmp_path, monkeypatch):
    """The parent's one reading of a child's file (launch.run_child): a
    record of another version is no figures, said as a run that ended
    before writing them, never half read."""
    import subprocess
    import sys

    from vramguard.dryrun import launch

    record = dataclasses.asdict(_record())
    script = tmp_path / "child.py"
    script.write_text(
        "import json, sys\n"
        "path = sys.argv[sys.argv.index('--result') + 1]\n"
        f"json.dump(dict({record!r}, format={contract.FORMAT!r}, version=99), open(path, 'w'))\n")
    real_popen = subprocess.Popen

    def popen(cmd, **kwargs):  # the child's command, run by this stand-in script instead
        return real_popen([sys.executable, str(script)] + cmd[cmd.index("--allocator"):], **kwargs)

    monkeypatch.setattr(launch.subprocess, "Popen", popen)
    out = tmp_path / "out"
    out.mkdir()
    run = launch.run_child("train.py", [], "native", dict(__import__("os").environ), str(out), "native",
                           echo=False, snapshot=False)
    assert run["fits"] is None and run["peak_allocated_bytes"] is None
    assert run["error"] == "ended before its figures were written (a crash: see its log)"
    assert run["exit_status"] == 0


def test_the_report_layer_names_the_dry_runs_folder_variable_as_the_contract_does():
    from vramguard.report import oom_measure

    assert oom_measure.IN_DRYRUN_ENV == contract.DIR_ENV
