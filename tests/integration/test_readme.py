"""The manual's Python blocks run as written, in order, in one namespace per page (README.md and every page of
docs/; ``tests/docs_blocks.py``). The library page (``docs/guide/library.md``: the "load and generate" snippet,
the processor added by hand, ``recallm.generation.generate`` and the matcher) runs on the tiny model and on a
real tokenizer's model (SmolLM2, the ``smollm2_dir`` fixture); the other pages on the tiny model. Only the model
directory ``"models/tiny"`` is replaced, as the page says any RecaLLM model directory may be.

Then what the library page's snippet promises: a batch padded as ``load_tokenizer`` pads it (on the left)
generates what each prompt generates alone (the GGUF-converted SmolLM2 used to come back right-padded, and its
batches were noise), and a right-padded batch is refused with one error line.
"""

from __future__ import annotations

import pytest
import torch

from recallm.errors import RecallmError
from tests import REPO_ROOT
from tests.docs_blocks import blocks, doc_files

pytestmark = pytest.mark.slow

LIBRARY = REPO_ROOT / "docs" / "guide" / "library.md"


def python_blocks(page=LIBRARY) -> list[tuple[int, str]]:
    """``(line, code)`` of every ```` ```python ```` block of a page that is not marked ``not run``."""
    return [(b.line, b.code) for b in blocks(page) if b.lang == "python" and b.not_run is None]


def _run_page(page, model_dir) -> dict:
    namespace: dict = {"__name__": "docs"}
    where = page.relative_to(REPO_ROOT)
    for line, code in python_blocks(page):
        code = code.replace('"models/tiny"', repr(str(model_dir)))
        exec(compile(code, f"{where}:{line}", "exec"), namespace)  # noqa: S102  (the manual's own code)
    return namespace


def test_the_readme_has_the_load_and_generate_snippet():
    """The library page (the README's Python section before the manual) has the snippet, and the manual's
    home page points to it."""
    code = [c for _, c in python_blocks()]
    assert len(code) >= 4 and any("model.generate(**enc" in c and '"models/tiny"' in c for c in code)
    assert "](guide/library.md)" in (REPO_ROOT / "docs" / "index.md").read_text()


@pytest.fixture(params=["tiny", "smollm2"])
def model_dir(request):
    return request.getfixturevalue("tiny_dir" if request.param == "tiny" else "smollm2_dir")


@pytest.mark.heavy  # its smollm2 case builds the session's SmolLM2 (smollm2_dir) on the worker that runs test_smollm2.py
def test_readme_python_blocks_run_and_batches_pad_on_the_left(model_dir):
    from recallm.recall import find_spans

    torch.manual_seed(0)
    namespace = _run_page(LIBRARY, model_dir)
    model, tok, prompts, ids = (namespace[k] for k in ("model", "tok", "prompts", "recall_ids"))
    assert len(namespace["replies"]) == len(prompts) and all(isinstance(r, str) for r in namespace["replies"])
    assert tok.padding_side == "left"
    for row in namespace["out"]:  # the constrained generation of the processor block
        assert all(span.verbatim for span in find_spans(row.tolist(), ids.start, ids.end))

    # a left-padded batch generates what each prompt generates alone
    enc = tok(prompts, return_tensors="pt", padding=True)
    width = enc["input_ids"].shape[1]
    batched = model.generate(**enc, max_new_tokens=8, do_sample=False)[:, width:]
    for row, prompt in enumerate(prompts):
        alone = tok([prompt], return_tensors="pt")
        single = model.generate(**alone, max_new_tokens=8, do_sample=False)[0, alone["input_ids"].shape[1] :]
        got = batched[row, : len(single)]
        assert got.tolist() == single.tolist(), (prompt, tok.decode(got), tok.decode(single))

    # a right-padded batch is refused, not continued after its padding
    right = tok(prompts, return_tensors="pt", padding=True, padding_side="right")
    with pytest.raises(RecallmError, match=r"prompt rows \[\d\] are padded on the right"):
        model.generate(**right, max_new_tokens=4)


def _other_pages_with_python():
    return [p for p in doc_files() if p != LIBRARY and python_blocks(p)]


@pytest.mark.parametrize("page", _other_pages_with_python(), ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_other_page_python_blocks_run(page, tiny_dir):
    torch.manual_seed(0)
    _run_page(page, tiny_dir)
