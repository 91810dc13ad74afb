"""turncache's own decoder: the forward of the families whose every layer is attention, and what only it uses.

``model`` (the args table per family, the fusion of the weights, the forward: ``Decoder``), ``names`` (the one name
map: a checkpoint's and a GGUF file's tensor names -> the decoder's, with each GGUF layout change), ``gguf_weights``
(a GGUF file read straight into the decoder's weights through it), ``checkpoint_weights`` (a model directory's
safetensors checkpoint, likewise), ``runtime`` (``DecoderAdapter``:
runs, steps, snapshots and rewinds over ``chat.models.kv_rows``), ``lora`` (LoRA adapters applied per row of a
step). It computes with ``chat.models.attention`` and the weight formats of ``chat.models.kernels``, and imports
nothing of ``chat.models.hf`` (tests/test_import_graph.py).
"""
