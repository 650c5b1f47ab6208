"""Imported by every verl process when ``VERL_USE_EXTERNAL_MODULES=recallm.grpo.cpu.plugin``
(``recallm.grpo.cpu.cpu_env()`` sets it): activates the CPU plugin (``recallm.grpo.cpu.activate``)."""

from recallm.grpo.cpu import activate

activate()
