"""bench/public_ooms/messages.py: PyTorch's out-of-memory message in each of its
wordings read back into figures, sizes compared at the printed precision, and
what is not such a message refused."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench",
                                "public_ooms"))
import messages as m  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30

NEW = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1024.00 MiB. GPU 0 has a total capacity "
       "of 23.64 GiB of which 62.81 MiB is free. \nProcess 539192 has 23.57 GiB memory in use. Of the allocated "
       "memory 23.02 GiB is allocated by PyTorch, and 121.49 MiB is reserved by PyTorch but unallocated. \nIf "
       "reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
TWO_PROCESSES = ("Tried to allocate 36.00 GiB. GPU 0 has a total capacity of 14.56 GiB of which 10.22 GiB is "
                 "free. Including non-PyTorch memory, this process has 4.11 GiB memory in use. Process 17435 has "
                 "240.00 MiB memory in use. Of the allocated memory 3.72 GiB is allocated by PyTorch, and "
                 "264.21 MiB is reserved by PyTorch but unallocated.")
TYPO_21 = ("Tried to allocate 15.00 GiB. GPU 0 has a total capacty of 39.56 GiB of which 11.15 GiB is free. "
           "Including non-PyTorch memory, this process has 28.41 GiB memory in use. Of the allocated memory "
           "25.28 GiB is allocated by PyTorch, and 1009.77 MiB is reserved by PyTorch but unallocated.")
OLD = ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 388.00 MiB (GPU 3; 31.75 GiB total "
       "capacity; 28.42 GiB already allocated; 340.94 MiB free; 30.39 GiB reserved in total by PyTorch) If "
       "reserved memory is >> allocated memory try setting max_split_size_mb")
SHORT = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB. \nGPU has 79.19 GiB total, "
         "6.68 GiB free, 72.48 GiB in use by this process.")
CUT = ("OutOfMemoryError: CUDA out of memory. Tried to allocate 9.47 GiB. GPU 0 has a total capacity of "
       "14.75 GiB of which 3.78 GiB is free. Process 2116 has 10.95 GiB memory in use. Of th")


def test_the_21_form_with_one_process():
    msg = m.parse_message(NEW)
    assert msg.form == "2.1+"
    assert msg.requested.text == "1024.00 MiB" and msg.requested.bytes == 1024 * MiB
    assert msg.total.text == "23.64 GiB" and msg.free.text == "62.81 MiB"
    assert msg.allocated.text == "23.02 GiB" and msg.reserved_unallocated.text == "121.49 MiB"
    assert msg.this_process is None and [s.text for s in msg.other_processes] == ["23.57 GiB"]
    expected = msg.total.bytes - msg.free.bytes - msg.allocated.bytes - msg.reserved_unallocated.bytes
    assert msg.non_pytorch_bytes() == expected and 0 < expected < 1 * GiB


def test_this_process_and_another_process():
    msg = m.parse_message(TWO_PROCESSES)
    assert msg.this_process.text == "4.11 GiB"
    assert [s.text for s in msg.other_processes] == ["240.00 MiB"]
    assert msg.requested.bytes == 36 * GiB


def test_the_21_typo_capacty():
    msg = m.parse_message(TYPO_21)
    assert msg.total.text == "39.56 GiB" and msg.free.text == "11.15 GiB"
    assert msg.reserved_unallocated.text == "1009.77 MiB"


def test_the_old_form_derives_reserved_but_unallocated():
    msg = m.parse_message(OLD)
    assert msg.form == "old"
    assert msg.requested.text == "388.00 MiB" and msg.total.text == "31.75 GiB"
    assert msg.allocated.text == "28.42 GiB" and msg.free.text == "340.94 MiB"
    assert msg.reserved_total.text == "30.39 GiB" and msg.reserved_unallocated is None
    assert msg.reserved_unallocated_bytes() == msg.reserved_total.bytes - msg.allocated.bytes


def test_the_old_form_reformatted_with_line_breaks_and_tabs():
    msg = m.parse_message("RuntimeError: CUDA out of memory. \nTried to allocate 9.49 GiB (\n\tGPU 0; \n\t24.00 GiB "
                          "total capacity; \n\t9.88 GiB already allocated;\n\t2.15 GiB free; \n\t19.38 GiB reserved "
                          "in total by PyTorch\n) \n")
    assert msg.form == "old" and msg.requested.text == "9.49 GiB" and msg.total.text == "24.00 GiB"
    assert msg.allocated.text == "9.88 GiB" and msg.free.text == "2.15 GiB" and msg.reserved_total.text == "19.38 GiB"


def test_the_short_form():
    msg = m.parse_message(SHORT)
    assert msg.form == "short"
    assert msg.total.text == "79.19 GiB" and msg.free.text == "6.68 GiB" and msg.this_process.text == "72.48 GiB"
    assert msg.allocated is None and msg.non_pytorch_bytes() is None


def test_a_message_cut_short_keeps_what_it_gives():
    msg = m.parse_message(CUT)
    assert msg.requested.text == "9.47 GiB" and msg.free.text == "3.78 GiB"
    assert msg.allocated is None and msg.reserved_unallocated_bytes() is None and msg.non_pytorch_bytes() is None


def test_zero_bytes_in_use():
    msg = m.parse_message("Tried to allocate 896.00 MiB. GPU 0 has a total capacity of 21.99 GiB of which "
                          "759.38 MiB is free. Including non-PyTorch memory, this process has 0 bytes memory in "
                          "use. Of the allocated memory 20.52 GiB is allocated by PyTorch, and 102.08 MiB is "
                          "reserved by PyTorch but unallocated.")
    assert msg.this_process.bytes == 0 and msg.this_process.text == "0 bytes"


@pytest.mark.parametrize("bad", [None, 12, "", "RuntimeError: CUDA error: an illegal memory access",
                                 "CUDA out of memory. Tried to allocate lots"])
def test_not_a_message_is_refused(bad):
    with pytest.raises(m.MessageError):
        m.parse_message(bad)


@pytest.mark.parametrize("bad", ["", "12", "1.5 GB", "GiB", "1.0.0 MiB", None])
def test_a_bad_size_is_refused(bad):
    with pytest.raises(ValueError):
        m.parse_size(bad)


@pytest.mark.parametrize("nbytes,text", [(0, "0 bytes"), (1024, "1024 bytes"), (1025, "1.00 KiB"),
                                         (MiB, "1024.00 KiB"), (MiB + 1, "1.00 MiB"), (GiB, "1024.00 MiB"),
                                         (GiB + 1, "1.00 GiB"), (int(23.016 * GiB), "23.02 GiB")])
def test_format_size_is_pytorchs(nbytes, text):
    assert m.format_size(nbytes) == text


def test_comparisons_at_the_printed_precision():
    real = m.parse_size("1024.00 MiB")
    assert m.equal_at_precision(real, GiB) and not m.equal_at_precision(real, GiB + 6 * 1024)
    assert m.signed_error(m.parse_size("2.00 GiB"), 3 * GiB) == pytest.approx(0.5)
    assert m.signed_error(m.parse_size("2.00 GiB"), None) is None
    assert m.signed_error(m.parse_size("0 bytes"), 5) is None
    assert m.half_step(m.parse_size("23.02 GiB")) == pytest.approx(0.005 * GiB)
