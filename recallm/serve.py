"""Serving a RecaLLM model with vLLM: the ``hf_overrides`` and the ``vllm serve`` command.

A RecaLLM checkpoint names its own architecture (``Recall<Base>ForCausalLM``, ``recallm_<base>``),
which vLLM does not know: vLLM serves it as its base architecture (``hf_overrides`` from
:func:`recallm.modeling.vllm_hf_overrides`) and the recall logits processor
(``recallm.recall.vllm:RecallLogitsProcessor``, for either of vLLM's model runners) keeps every recall
span a verbatim copy of its context, reading the recall token ids from the same config (``recallm.modeling.served_hf_overrides``
merges a user's own overrides with those: one place, used by ``recallm-serve`` and ``recallm-grpo``);
:func:`serve_command` builds the ``vllm serve`` command line ``recallm-serve`` runs: vLLM's
OpenAI-compatible server, which ``recallm-eval backend.name=openai`` and the RLM scaffold point
at (``base_url=http://HOST:PORT/v1``, ``served_model=<name>``). A LoRA adapter directory
(``recallm-sft``'s ``final/adapter``, ``recallm-export --keep-adapter``'s ``<out>/adapter``) is served
with vLLM's LoRA support: its base model plus the adapter under the served name (``_lora_args``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from recallm.errors import RecallmError

__all__ = ["serve_command", "ServeSettings"]

#: ``recallm.recall.vllm.PROCESSOR_FQCN`` (named here: importing that module loads torch)
PROCESSOR = "recallm.recall.vllm:RecallLogitsProcessor"
#: every name of the recall processor (one interface each, or both): a user's own is kept, not doubled
RECALL_PROCESSORS = (
    PROCESSOR,
    "recallm.recall.vllm:RecallLogitsProcessorV1",
    "recallm.recall.vllm:RecallLogitsProcessorV2",
)


class ServeSettings:
    """``recallm-serve``'s own options (everything else goes to ``vllm serve`` unchanged);
    ``recall_constrained=False`` (``--no-recall``) serves without the recall processor."""

    def __init__(
        self,
        model: str | Path,
        *,
        host: str = "127.0.0.1",
        port: int = 8000,
        served_model_name: str | None = None,
        recall_constrained: bool = True,
    ) -> None:
        if not 0 < int(port) < 65536:
            raise RecallmError(f"--port must be in 1..65535, got {port}")
        self.model = Path(model)
        self.host = host
        self.port = int(port)
        self.served_model_name = served_model_name or self.model.resolve().name
        self.recall_constrained = bool(recall_constrained)


def _pop_option(args: list[str], name: str) -> tuple[list[str], list[str]]:
    """Remove ``--name V`` / ``--name=V`` (and ``--name`` with several values up to the next
    option) from ``args``; return (remaining args, the values)."""
    rest, values, i = [], [], 0
    alias = {name, name.replace("-", "_")}
    while i < len(args):
        arg = args[i]
        key, eq, value = arg.partition("=")
        if key in alias:
            if eq:
                values.append(value)
                i += 1
            else:
                i += 1
                while i < len(args) and not args[i].startswith("--"):
                    values.append(args[i])
                    i += 1
            continue
        rest.append(arg)
        i += 1
    return rest, values


def serve_command(settings: ServeSettings, extra: Sequence[str] = (), python: str | None = None) -> list[str]:
    """The ``vllm serve`` command for ``settings`` (checks the model first; ``extra``: more
    ``vllm serve`` arguments, whose ``--hf-overrides`` are merged and ``--logits-processors`` kept)."""
    from recallm.modeling import (
        adapter_base,
        check_recallm_model,
        read_model_config,
        served_hf_overrides,
        vllm_hf_overrides,
    )

    check_recallm_model(settings.model, weights=True)  # one line: no RecaLLM model, damaged or NaN weights
    config = read_model_config(settings.model)  # (a LoRA adapter: its base's)
    base = adapter_base(settings.model)
    extra = list(extra)
    for own in ("--host", "--port", "--served-model-name", "--model"):
        if any(a == own or a.startswith(own + "=") for a in extra):
            raise RecallmError(
                f"{own} is an option of recallm-serve itself: pass it before the model's extra arguments"
            )
    extra, user_overrides = _pop_option(extra, "--hf-overrides")
    if len(user_overrides) > 1:
        raise RecallmError("--hf-overrides was given more than once")
    overrides = served_hf_overrides(
        user_overrides[0] if user_overrides else None, vllm_hf_overrides(config), "--hf-overrides"
    )
    extra, processors = _pop_option(extra, "--logits-processors")
    if settings.recall_constrained:
        processors = processors if any(p in RECALL_PROCESSORS for p in processors) else [*processors, PROCESSOR]
    else:
        processors = [p for p in processors if p not in RECALL_PROCESSORS]
    command = [
        python or sys.executable,
        "-m",
        "recallm.serve",  # vLLM's own CLI, in a process that knows the recallm_<base> configs (below)
        "serve",
        str(base or settings.model),
        "--host",
        settings.host,
        "--port",
        str(settings.port),
        "--served-model-name",
        settings.served_model_name if base is None else f"{settings.served_model_name}-base",
        "--hf-overrides",
        json.dumps(overrides, sort_keys=True),
    ]
    if base is not None:
        command += _lora_args(settings)
    if processors:
        command += ["--logits-processors", *processors]
    command += extra
    return command


def _lora_args(settings: ServeSettings) -> list[str]:
    """A LoRA adapter directory is served as vLLM serves adapters: its base model (as ``<name>-base``) with
    the adapter as the model ``<name>`` (``--enable-lora --lora-modules``), the adapter's tokenizer
    (``recallm.modeling.vllm_lora_rank``: the rank vLLM needs; an adapter with trained token rows is refused)."""
    from recallm.modeling import vllm_lora_rank

    adapter = settings.model
    max_rank = vllm_lora_rank(adapter)
    tokenizer = adapter if (adapter / "tokenizer_config.json").is_file() else None
    return [
        "--enable-lora",
        "--max-lora-rank",
        str(max_rank),
        "--lora-modules",
        f"{settings.served_model_name}={adapter.resolve()}",
        *(["--tokenizer", str(tokenizer.resolve())] if tokenizer else []),
    ]


def _vllm_cli() -> int | None:
    """``python -m recallm.serve serve <model> ...``: vLLM's CLI (``vllm serve``) after registering
    the ``recallm_<base>`` configs with transformers. vLLM reads the checkpoint's config with
    ``AutoConfig`` before ``--hf-overrides`` apply, and ``import recallm`` no longer registers them
    (it loads no torch), so the plain ``vllm serve`` process refused ``model type recallm_qwen2``."""
    from vllm.entrypoints.cli.main import main as vllm_main

    import recallm.modeling  # noqa: F401  (registers the recallm_<base> configs)

    return vllm_main()


if __name__ == "__main__":
    sys.exit(_vllm_cli())
