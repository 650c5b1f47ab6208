"""Dataset-backed tasks (paper App. C.4, Table 1); importing this package registers them all.

=================  ==================  =========================================================
module             category            tasks (``name`` = data_source)
=================  ==================  =========================================================
``multihop``       ``multi_hop_qa``    ``hotpotqa``, ``2wikimqa``, ``musique``
``singlehop``      ``single_hop_qa``   ``nq``, ``triviaqa``
``short_math``     ``short_math``      ``dapo_math``, ``mcqa_math``
``icl``            ``icl``             ``banking77``, ``massive``
``quality``        ``long_doc_qa``     ``quality``
``reranking``      ``reranking``       ``msmarco``
``citation``       ``entity_citation`` ``qampari``
=================  ==================  =========================================================

Every task reads local files whose location is its ``path`` parameter (``io``: the formats);
distractor passages come from ``negatives`` (random, BM25, dense).
"""

from data_gen.datasets import citation, icl, multihop, quality, reranking, short_math, singlehop  # noqa: F401
