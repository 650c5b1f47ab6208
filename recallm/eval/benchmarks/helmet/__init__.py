"""HELMET (Yen et al., 2025): the seven categories of the paper's Table 2 (``benchmark``), and the
per-task facts and local-data readers (``tasks``)."""

from recallm.eval.benchmarks.helmet.benchmark import Helmet, HelmetJsonKV
from recallm.eval.benchmarks.helmet.tasks import CATEGORIES, HELMET_LENGTHS, TASKS, HelmetTask

__all__ = ["Helmet", "HelmetJsonKV", "CATEGORIES", "HELMET_LENGTHS", "TASKS", "HelmetTask"]
