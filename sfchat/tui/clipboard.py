"""Copying to the clipboard from a terminal app, and saying truthfully where the text went.

Textual's copy_to_clipboard asks the terminal to copy (OSC 52): many terminals do, some refuse, and tmux drops
the request unless its `set-clipboard` is on. So the text also goes where a program can put it for sure: tmux's
paste buffer inside tmux (`load-buffer -w` also hands it to the terminal's clipboard where tmux may), and the
desktop's clipboard tool where there is one.
"""
from __future__ import annotations

import os
import shutil
import subprocess

# (the tool, its arguments, the variable that says its display is there)
TOOLS = [("wl-copy", [], "WAYLAND_DISPLAY"), ("xclip", ["-selection", "clipboard"], "DISPLAY"),
         ("xsel", ["--clipboard", "--input"], "DISPLAY"), ("pbcopy", [], None)]


def _give(cmd: list[str], text: str) -> bool:
    try:  # no pipes kept: xclip stays behind to serve the selection
        return subprocess.run(cmd, input=text.encode(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=3).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def copy(app, text: str) -> str:
    """Copy `text` every way that may work here; where it went, to end "Copied … to ___"."""
    app.copy_to_clipboard(text)
    where = []
    if os.environ.get("TMUX") and (_give(["tmux", "load-buffer", "-w", "-"], text)
                                   or _give(["tmux", "load-buffer", "-"], text)):  # tmux < 3.2 has no -w
        where.append("tmux's paste buffer (prefix, then ] pastes it)")
    for tool, args, display in TOOLS:
        if shutil.which(tool) and (display is None or os.environ.get(display)) and _give([tool, *args], text):
            where.append(f"the clipboard ({tool})")
            break
    return " and ".join(where) or "the terminal's clipboard (OSC 52), if your terminal lets apps set it"
