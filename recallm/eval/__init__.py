"""Evaluation: backends, benchmarks, the judge, the resumable runner and the report (``recallm-eval``).

* ``backends`` - ``HFBackend`` (``generate``, constrained or not, left-padded batches, a
  length-extension hook), ``VLLMBackend`` (GPU nodes), ``OpenAIBackend`` (any
  OpenAI-compatible server through ``recallm.clients``); ``make_backend(cfg, ...)``.
* ``benchmarks`` - ``lost_in_thought`` (paper §2, App. A: retrieval vs reasoning retrieval on
  the same dictionary, with the judge-located injection analysis), ``in_domain`` (the validation
  cells, scored with the training reward), ``ruler`` (RULER's 13 tasks), ``helmet`` (HELMET's
  seven categories from local copies of its data) and ``helmet_json_kv``; ``make_benchmarks(suite, ...)``.
* ``judge`` - a judge model at any OpenAI-compatible endpoint (LongQA and Summ with HELMET's own
  prompts, the first retrieval attempt), HELMET's TRUE NLI model for the citations
  (``nli=true_t5``), deterministic fallbacks.
* ``scoring`` - the scoring functions as upstream writes them (RULER's string_match_all/part,
  HELMET's metrics, ALCE's citations with the trained English Punkt), answer extraction, the
  injection helpers, text-level span checks.
* ``runner`` - ``run_eval``: batched generation with a progress bar, per-example JSONL written
  incrementally and resumably, ``summary.json``.
* ``report`` - ``build_report``: the paper's tables (with its published numbers beside, example
  counts and bootstrap intervals) and plots comparing runs; ``paper_reference.yaml`` holds those
  numbers. ``curves`` - GRPO's training curves (Figure 10), a report section and ``recallm-grpo plot``.
"""

from recallm.eval.types import Example, Generation, GenerationSettings, Score, SpanStats, Spec, TextRequest

__all__ = ["Example", "Generation", "GenerationSettings", "TextRequest", "Score", "SpanStats", "Spec"]
