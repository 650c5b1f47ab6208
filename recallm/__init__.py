"""RecaLLM: training reasoning LLMs to recall evidence verbatim from their context.

Importing ``recallm`` registers the masked model classes (``model_type = "recallm_<base>"``)
with ``AutoConfig`` and ``AutoModelForCausalLM``.
"""

from recallm import modeling as _modeling  # noqa: F401  (registers the model classes)
from recallm.errors import RecallmError
from recallm.tokens import RECALLM_TOKENS, RecallTokenIds, add_recall_tokens

__version__ = "0.1.0"

__all__ = ["RecallmError", "RECALLM_TOKENS", "RecallTokenIds", "add_recall_tokens", "__version__"]
