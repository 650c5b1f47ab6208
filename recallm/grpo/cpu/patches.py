"""The out-of-tree patches of verl 0.9.1 on a CPU, applied when their module is imported: two that it
needs to run at all, and one that removes a cost only a CPU pays.

verl's files are never edited: each patch replaces one module attribute from outside. A patch
is installed with :func:`after_import`, which runs it right after the target module executes
(or at once if it is already imported), so activating the plugin does not import verl's heavy
modules into every process, and modules that copy the name with ``from ... import`` later get
the patched object.
"""

from __future__ import annotations

import importlib.abc
import logging
import os
import sys
from collections.abc import Callable
from types import ModuleType

__all__ = ["after_import", "install", "baseline", "cpu_logprobs_from_logits"]

log = logging.getLogger(__name__)

_Hook = Callable[[ModuleType], None]


class _PatchingLoader(importlib.abc.Loader):
    """Delegates to the real loader; runs the hooks after the module body has executed."""

    def __init__(self, loader, hooks: list[_Hook]) -> None:
        self._loader = loader
        self._hooks = hooks

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        for hook in self._hooks:
            hook(module)

    def __getattr__(self, name: str):  # get_source, get_resource_reader, is_package, ...
        return getattr(self._loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """A meta-path finder that only wraps the loader of the modules it has hooks for."""

    def __init__(self) -> None:
        self.hooks: dict[str, list[_Hook]] = {}

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _PatchingLoader(spec.loader, self.hooks.pop(fullname))
        return spec


_FINDER = _PostImportFinder()


def after_import(module_name: str, hook: _Hook) -> None:
    """Run ``hook(module)`` once ``module_name`` is imported (now, if it already is)."""
    module = sys.modules.get(module_name)
    if module is not None:
        hook(module)
        return
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    _FINDER.hooks.setdefault(module_name, []).append(hook)


# --- patch 1: a gloo-only default process group -------------------------------------------------
#
# What verl does: ``verl.utils.distributed.initialize_global_process_group_ray`` (called by every
# training worker, ``workers/engine_workers.py``) builds the backend string
# ``f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"``.
# Why it fails on a CPU: with the CPU platform that is ``"cpu:gloo,cpu:gloo"``, and
# ``torch.distributed.init_process_group`` rejects it ("Duplicate device type cpu").
# What we change: when no backend is passed and the device is the CPU, pass ``backend="gloo"``;
# every other call goes through unchanged. The wrapper replaces the function in
# ``verl.utils.distributed`` and in the modules that had already imported it by name.

_PG_MODULES = ("verl.workers.engine_workers", "verl.checkpoint_engine.base")


def wrap_process_group_init(distributed: ModuleType, marker: str, wrap: Callable[[Callable], Callable]) -> None:
    """Replace ``verl.utils.distributed.initialize_global_process_group_ray`` with ``wrap(original)``, there and
    in the modules that imported it by name (``_PG_MODULES``); once per ``marker`` (an attribute set on the
    wrapper), so that wrappers stack (this CPU patch, ``recallm.grpo.worker_hooks``'s collective timeout)."""
    original = distributed.initialize_global_process_group_ray
    if getattr(original, marker, False):
        return
    wrapper = wrap(original)
    setattr(wrapper, marker, True)
    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    distributed.initialize_global_process_group_ray = wrapper
    for name in _PG_MODULES:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "initialize_global_process_group_ray", None) is original:
            module.initialize_global_process_group_ray = wrapper


#
# And one retry: verl picks ``MASTER_PORT`` when it creates a worker group (a port the kernel had free then,
# released at once) and the worker binds it seconds later, after its imports; another process can take the
# port in between (seen once in ``make test``: ``EADDRINUSE`` at the second run of the RLM root's GRPO test). A
# process group of one process has no other rank that knows the port, so there the wrapper picks another free
# port and tries again (``PORT_RETRIES`` times in all); with more ranks the error stands, as verl raises it.

PORT_RETRIES = 3


def _port_taken(exc: BaseException) -> bool:
    return "EADDRINUSE" in str(exc) or "address already in use" in str(exc).lower()


def _patch_process_group(distributed: ModuleType) -> None:
    def wrap(original):
        def initialize_global_process_group_ray(timeout_second=None, backend=None):
            from verl.utils.device import get_device_name

            if backend is None and get_device_name() == "cpu":
                backend = "gloo"
            for attempt in range(1, PORT_RETRIES + 1):
                try:
                    return original(timeout_second=timeout_second, backend=backend)
                except RuntimeError as exc:  # (torch's DistNetworkError)
                    if attempt == PORT_RETRIES or os.environ.get("WORLD_SIZE") != "1" or not _port_taken(exc):
                        raise
                    from verl.utils.net_utils import get_free_port

                    taken, os.environ["MASTER_PORT"] = os.environ.get("MASTER_PORT"), str(get_free_port("")[0])
                    log.warning("MASTER_PORT %s was taken meanwhile; one process: trying port %s", taken,
                                os.environ["MASTER_PORT"])  # fmt: skip

        return initialize_global_process_group_ray

    wrap_process_group_init(distributed, "_recallm_cpu", wrap)


# --- patch 2: no pinned memory for the FSDP2 CPU-offloaded reference -----------------------------
#
# What verl does: ``FSDPEngine._build_fsdp_module`` (``workers/engine/fsdp/transformer_impl.py``)
# gives a forward-only FSDP2 module (the reference policy, used with ``use_kl_loss=True``) or one
# with ``offload_policy=True`` a hard-coded ``CPUOffloadPolicy(pin_memory=True)``.
# Why it fails on a CPU: FSDP2 then pins the offloaded parameters, and ``Tensor.pin_memory()``
# raises "Cannot access accelerator device when none is available" on a CPU-only torch.
# What we change: the module's ``CPUOffloadPolicy`` name becomes a subclass that always sets
# ``pin_memory=False`` (the parameters are on the CPU already; pinning only speeds up copies to an
# accelerator). ``isinstance`` checks against torch's class still hold.


def _patch_cpu_offload_policy(transformer_impl: ModuleType) -> None:
    original = getattr(transformer_impl, "CPUOffloadPolicy", None)
    if original is None or getattr(original, "_recallm_cpu", False):
        return

    class CPUOffloadPolicy(original):  # type: ignore[misc, valid-type]
        """torch's ``CPUOffloadPolicy`` without pinned memory (recallm CPU plugin)."""

        _recallm_cpu = True

        def __init__(self, pin_memory: bool = True) -> None:  # noqa: ARG002 - always False on a CPU
            super().__init__(pin_memory=False)

    transformer_impl.CPUOffloadPolicy = CPUOffloadPolicy


# --- patch 3: vectorised token log-probs -------------------------------------------------------
#
# What verl does: ``FSDPEngineWithLMHead.prepare_model_outputs`` (``workers/engine/fsdp/
# transformer_impl.py``) gets every token's log-prob from ``verl.utils.torch_functional.
# logprobs_from_logits``, which uses flash-attn's fused cross-entropy when it is installed (GPUs)
# and otherwise ``logprobs_from_logits_v2``: a Python loop of one ``logsumexp`` per token (to bound
# a GPU's peak memory).
# Why it costs on a CPU: the logits of a step are (tokens, vocab) — 5,600 x 2,304 for the tiny
# model's benchmark step — so the loop makes thousands of tiny ops and autograd nodes per forward;
# measured on one core: 0.11 s forward and 0.45 s forward + backward, against 0.03 s and 0.14 s for
# the same values computed in one vectorised op (old-log-prob, reference and update passes: ~0.45
# s of CPU time per step).
# What we change: the FSDP engine module's ``logprobs_from_logits`` becomes a wrapper that, for
# CPU tensors, computes ``logit[label] - logsumexp(logits)`` over chunks of rows (bounded
# temporary memory) — the same formula as v2's float32 branch, bit-identical — and calls verl's
# function for anything else. ``RECALLM_CPU_BASELINE=1`` leaves verl's function in place (the
# benchmark's baseline).

_LOGPROB_CHUNK_ELEMENTS = 1 << 26  # logits elements per chunk (256 MB of float32)


def cpu_logprobs_from_logits(logits, labels):
    """Log-probability of ``labels`` under ``logits`` (..., vocab), vectorised in row chunks."""
    import torch

    shape = logits.shape[:-1]
    flat = logits.reshape(-1, logits.shape[-1])
    index = labels.reshape(-1, 1)
    rows = max(1, _LOGPROB_CHUNK_ELEMENTS // max(1, flat.shape[-1]))
    if logits.dtype not in (torch.float32, torch.float64):  # as verl's v2: log_softmax for low precision
        parts = [
            torch.log_softmax(flat[i : i + rows], dim=-1).gather(-1, index[i : i + rows]).squeeze(-1)
            for i in range(0, flat.shape[0], rows)
        ]
    else:
        parts = [
            flat[i : i + rows].gather(-1, index[i : i + rows]).squeeze(-1) - torch.logsumexp(flat[i : i + rows], dim=-1)
            for i in range(0, flat.shape[0], rows)
        ]
    out = parts[0] if len(parts) == 1 else torch.cat(parts)
    return out.reshape(shape)


def _patch_logprobs(transformer_impl: ModuleType) -> None:
    original = getattr(transformer_impl, "logprobs_from_logits", None)
    if original is None or getattr(original, "_recallm_cpu", False):
        return

    def logprobs_from_logits(logits, labels, inplace_backward=True):
        if logits.device.type == "cpu":
            return cpu_logprobs_from_logits(logits, labels)
        return original(logits, labels, inplace_backward=inplace_backward)

    logprobs_from_logits._recallm_cpu = True  # type: ignore[attr-defined]
    logprobs_from_logits.__wrapped__ = original  # type: ignore[attr-defined]
    transformer_impl.logprobs_from_logits = logprobs_from_logits


def baseline() -> bool:
    """``RECALLM_CPU_BASELINE=1``: the CPU step without this plugin's speed-ups (patch 3, the relaxed
    Ray background intervals, no gradient checkpointing) — what ``bench/grpo_step.py`` compares against."""
    return os.environ.get("RECALLM_CPU_BASELINE", "0") == "1"


def install() -> None:
    """Install the patches (idempotent)."""
    after_import("verl.utils.distributed", _patch_process_group)
    after_import("verl.workers.engine.fsdp.transformer_impl", _patch_cpu_offload_policy)
    if not baseline():
        after_import("verl.workers.engine.fsdp.transformer_impl", _patch_logprobs)
