"""Every task module; importing this package registers them all."""

from data_gen.tasks import kv, niah, votes  # noqa: F401
