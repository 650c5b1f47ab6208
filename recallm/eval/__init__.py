"""Evaluation: backends, benchmarks, the resumable runner and the report (``recallm-eval``).

* ``backends`` - ``HFBackend`` (``generate``, constrained or not, left-padded batches, a
  length-extension hook), ``VLLMBackend`` (GPU nodes), ``OpenAIBackend`` (any
  OpenAI-compatible server through ``recallm.clients``); ``make_backend(cfg, ...)``.
* ``benchmarks`` - ``lost_in_thought`` (paper §2, App. A: retrieval vs reasoning retrieval on
  the same dictionary, with the injection analysis), ``in_domain`` (the validation cells,
  scored with the training reward), ``ruler`` (11 offline RULER tasks), ``helmet_json_kv``;
  ``make_benchmarks(suite, ...)``.
* ``scoring`` - the scoring functions (RULER's string_match_all/part, HELMET's substring exact
  match, answer extraction, the injection helpers, text-level span checks).
* ``runner`` - ``run_eval``: batched generation with a progress bar, per-example JSONL written
  incrementally and resumably, ``summary.json``.
* ``report`` - ``build_report``: Markdown tables and PNG plots comparing runs.
"""

from recallm.eval.types import Example, Generation, GenerationSettings, GenRequest, Score, SpanStats, Spec

__all__ = ["Example", "Generation", "GenerationSettings", "GenRequest", "Score", "SpanStats", "Spec"]
