"""The synthetic task modules; importing this package registers them (``data_gen.datasets``
registers the dataset-backed ones; ``data_gen.base.task_names`` imports both)."""

from data_gen.tasks import kv, niah, toy, votes  # noqa: F401
