"""Every task module; importing this package registers them all (synthetic and dataset-backed)."""

from data_gen import datasets  # noqa: F401
from data_gen.tasks import kv, niah, toy, votes  # noqa: F401
