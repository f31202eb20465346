"""What install() has done, in one dict: read by install.py, which writes
it, and by the modules it uses (patches.py reads the settings), so that
none of them imports install.py back."""

install_state = {"installed": False, "allocator": None, "patched": False, "settings": None, "hooks": None,
                 "arena": None, "nccl": None}
