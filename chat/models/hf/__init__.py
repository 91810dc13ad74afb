"""transformers' forward, for the families the own decoder does not compute (hybrid recurrent and multimodal
models), and the one place of ``chat.models`` that imports transformers' modeling modules.

``runtime`` (``TransformersAdapter``), ``run_cache`` (a transformers Cache over ``chat.models.kv_rows``), ``ragged``
(several runs in one forward, each attending to its own rows through ``chat.models.attention``), ``fast_paths``
(every patch of the transformers model in one ``install``), ``multimodal`` / ``families_mm`` / ``media_prep`` /
``mrope`` (media models), ``gguf_model`` (a GGUF file read straight into a transformers model, its weights left in
their block formats; the own decoder packs that model when its family is one it computes). It imports nothing of
``chat.models.decoder`` (tests/test_import_graph.py).
"""
