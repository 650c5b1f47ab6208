"""``recallm.modeling`` is where the model classes register (verl's ``external_lib`` names it): a bare
``import recallm`` leaves transformers without them. Moved from tests/unit/test_architecture.py (its
subprocess imports torch and transformers: ~6 s of CPU)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # (~6 s of CPU: the subprocess imports torch and transformers)
def test_the_model_classes_register_where_a_model_is_loaded():
    """``recallm.modeling`` is what registers (verl's external_lib names it); it does load torch."""
    code = (
        "import recallm, sys\n"
        "from transformers import AutoConfig\n"
        "try:\n"
        "    AutoConfig.for_model('recallm_qwen2')\n"
        "except ValueError:\n"
        "    print('unregistered')\n"
        "import recallm.modeling\n"
        "print(type(AutoConfig.for_model('recallm_qwen2')).__name__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["unregistered", "RecallQwen2Config"]
