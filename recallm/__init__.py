"""RecaLLM: training reasoning LLMs to recall evidence verbatim from their context.

``import recallm`` is light: it loads neither torch nor transformers, so ``data_gen``, ``rewards``
and every command that does not touch a model start fast. The masked model classes
(``model_type = "recallm_<base>"``) are registered with ``AutoConfig`` and
``AutoModelForCausalLM`` by importing ``recallm.modeling``: whatever loads a RecaLLM model
imports that module (verl's ``actor_rollout_ref.model.external_lib=recallm.modeling``).
The layers of the package are described in ARCHITECTURE.md.
"""

from recallm.errors import RecallmError
from recallm.tokens import RECALLM_TOKENS, RecallTokenIds, add_recall_tokens

__version__ = "0.2.0"

__all__ = ["RecallmError", "RECALLM_TOKENS", "RecallTokenIds", "add_recall_tokens", "__version__"]
