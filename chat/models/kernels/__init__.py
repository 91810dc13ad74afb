"""The weight formats and C kernels both forwards compute with: ``matrices`` (the table: a weight matrix class per
weight format), ``dense_matrices`` (float32, bfloat16, int8), ``block_matrices`` (a GGUF file's own block formats,
with ``blocks.c``), ``native`` (``native.c``'s attention and int8 kernels, built and loaded, and their typed
contract). The own decoder (``chat.models.decoder``) packs its weights into them; transformers' forward
(``chat.models.hf.fast_paths``) swaps its linear layers for them.
"""
