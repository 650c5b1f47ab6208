"""The README's Python blocks run as written, in order, in one namespace, on the tiny model and on a
real tokenizer's model (SmolLM2, the ``smollm2_dir`` fixture): the "load and generate" snippet, the
processor added by hand, ``recallm.generation.generate`` and the matcher. Only the model directory
``"models/tiny"`` is replaced, as the README says any RecaLLM model directory may be.

Then what the snippet promises: a batch padded as ``load_tokenizer`` pads it (on the left) generates
what each prompt generates alone (the GGUF-converted SmolLM2 used to come back right-padded, and its
batches were noise), and a right-padded batch is refused with one error line.
"""

from __future__ import annotations

import re

import pytest
import torch

from recallm.errors import RecallmError
from tests import REPO_ROOT

pytestmark = pytest.mark.slow


def python_blocks() -> list[tuple[int, str]]:
    """``(line, code)`` of every ```` ```python ```` block of the README."""
    text = (REPO_ROOT / "README.md").read_text()
    return [
        (text.count("\n", 0, m.start()) + 2, m.group(1))
        for m in re.finditer(r"^```python\n(.*?)^```$", text, re.M | re.S)
    ]


def test_the_readme_has_the_load_and_generate_snippet():
    blocks = [code for _, code in python_blocks()]
    assert len(blocks) >= 4 and any("model.generate(**enc" in code and '"models/tiny"' in code for code in blocks)


@pytest.fixture(params=["tiny", "smollm2"])
def model_dir(request):
    return request.getfixturevalue("tiny_dir" if request.param == "tiny" else "smollm2_dir")


@pytest.mark.heavy  # its smollm2 case builds the session's SmolLM2 (smollm2_dir) on the worker that runs test_smollm2.py
def test_readme_python_blocks_run_and_batches_pad_on_the_left(model_dir):
    from recallm.recall import find_spans

    namespace: dict = {"__name__": "readme"}
    torch.manual_seed(0)
    for line, code in python_blocks():
        code = code.replace('"models/tiny"', repr(str(model_dir)))
        exec(compile(code, f"README.md:{line}", "exec"), namespace)  # noqa: S102  (the README's own code)
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
