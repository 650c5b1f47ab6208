"""Task data for RecaLLM: task generators, augmentations, length fitting, SFT traces, annotation.

``data_gen.generate`` turns a mixture (``configs/data/*.yaml``) into train rows, validation cells and
SFT traces (``recallm-data``); the tasks live in ``data_gen.tasks`` (synthetic) and ``data_gen.datasets``
(built on local copies of public data sets), prompts are fitted to a length by ``data_gen.fit``, traces
are written by ``data_gen.traces`` (programmatic) and ``data_gen.annotate`` (``recallm-annotate``).
``data_gen.toy_kv`` is the prompt of ``recallm-decoding-demo``. Importing it loads no torch.
"""
