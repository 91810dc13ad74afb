"""transformers' forward, for the families the own decoder does not compute (hybrid recurrent and multimodal
models), and the one place of ``chat.models`` that imports transformers' modeling modules.

``runtime`` (``TransformersAdapter``), ``run_cache`` (a transformers Cache over ``chat.models.kv_rows``), ``ragged``
(several runs in one forward, each attending to its own rows through ``chat.models.attention``), ``fast_paths``
(every patch of the transformers model in one ``install``), ``multimodal`` (``MultimodalAdapter``) / ``families_mm``
(the served media families, each a ``MultimodalFamily`` with its encoders) / ``media_prep`` / ``mrope`` (media
models), ``gguf_model`` (a GGUF file read straight into a transformers model, its weights left in their block
formats; the own decoder packs that model when its family is one it computes; every GGUF file's config and
tokenizer), ``metadata_store`` (those kept by the file's sha256, parsed once per machine). It imports nothing of
``chat.models.decoder`` (tests/test_import_graph.py).

The two adapters' modules, :data:`FORWARD`, load when first used (``hf.runtime``, ``hf.multimodal`` after
``from chat.models import hf``: PEP 562, as ``chat.models`` exports its own names): they import transformers' modeling
(``transformers.modeling_utils``, ~1.1 s on this machine's CPU), which a model on the own decoder never runs, so the
loader (:mod:`chat.models.registry`) names them at its top without every load of the default model paying for them.
"""

from __future__ import annotations

import importlib
from types import ModuleType

FORWARD = ("runtime", "multimodal")  # the modules of transformers' forward that load on first use


def __getattr__(name: str) -> ModuleType:
    if name in FORWARD:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
