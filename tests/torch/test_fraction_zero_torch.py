"""torch.cuda.set_per_process_memory_fraction(0): the out-of-memory report
says a fraction of 0, not the 1-byte budget the hook keeps it as."""
import pytest

from fakegpu import run, summary_rows

# torch_version: runs in the CUDA 12 tier too (docs/development.md)
pytestmark = [pytest.mark.torch, pytest.mark.torch_version]


def test_the_report_of_a_fraction_of_zero_says_so():
    out = run("""
        vramguard.install()
        x = torch.empty(MiB, dtype=torch.uint8, device="cuda")
        torch.cuda.set_per_process_memory_fraction(0.0)
        out["refused"] = error(torch.empty, 3 * MiB, dtype=torch.uint8, device="cuda")[0]
        out["budget_line"] = [line for line in str(vramguard.last_oom()).splitlines()
                              if line.startswith("Budget:")]
        try:
            torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError as e:
            out["message"] = str(e)
        out["summary"] = torch.cuda.memory_summary()
    """)
    assert out["refused"] == "OutOfMemoryError"
    assert out["budget_line"] == [
        "Budget: a budget of 0 bytes (torch.cuda.set_per_process_memory_fraction(0)) on a 1.00 GiB device; "
        "room to reserve more: 0 bytes; 1022.00 MiB free on the device"]
    # PyTorch's error and the summary say the same, not "1 byte"
    assert "vramguard: a memory fraction of 0 allows no new memory" in out["message"]
    assert "1 byte" not in out["message"]
    assert summary_rows(out["summary"])[0] == ("vramguard memory summary, device 0 "
                              "(budget 0 bytes (a memory fraction of 0) on a 1.00 GiB device)")
