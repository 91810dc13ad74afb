"""``load_renderer(spec)``: a model's chat template and media kinds without its weights (a cluster's ingress holds
nothing else), and the readers of a model's text side that the loader (:mod:`chat.models.registry`) shares: its config,
its tokenizer, the tiny models' tokenizers and configs, a template given in place of the model's own.

It imports transformers' configuration and tokenizer classes, never its modeling modules nor the runtimes (the own
decoder's ``DecoderAdapter`` imports the engine's grammar machinery, transformers' forward its modeling: seconds an
ingress never needs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import AutoConfig, AutoTokenizer

from chat.models.chat_template import read_template
from chat.models.errors import ModelLoadError, UnknownModelError
from chat.models.families import check_config
from chat.models.hf import gguf_model
from chat.models.hf.families_mm import is_multimodal, load_multimodal_text
from chat.models.renderer import TemplateRenderer
from chat.models.specs import clean_spec, directory_of, gguf_file, gguf_name, model_choices
from chat.models.tiny.media import TINY_MM, tiny_family, tiny_multimodal_text
from chat.models.tiny.text import TINY, TINY_REFUSED, tiny_config
from chat.models.tiny.tokenizer import ASSET_DIR


def load_renderer(spec: str, chat_template: str | None = None) -> TemplateRenderer:
    """The chat template renderer of ``spec``: the name, modalities and text rendering of ``load_model(spec)``'s
    adapter, without reading or building its weights (``dtype`` and ``weights`` do not change what it renders);
    ``chat_template`` as for :func:`chat.models.registry.load_model`.

    Raises:
        InvalidSettingError: ``chat_template`` cannot be read or does not compile.
        UnknownModelError: ``spec`` is no built-in name, no tiny model and no directory.
        UnsupportedArchitectureError: the model family is refused (as ``load_model`` refuses it).
        ModelLoadError: files are missing or unreadable.
    """
    template = read_template(chat_template) if chat_template is not None else None
    spec = clean_spec(spec)
    if spec.startswith("tiny-"):
        return tiny_renderer(spec.removeprefix("tiny-"), chat_template=template)
    gguf = gguf_file(spec)
    if gguf is not None:
        tokenizer = with_template(gguf_model.checked_tokenizer(gguf), template)
        return TemplateRenderer(tokenizer, name=gguf_name(spec, gguf))
    path, name, _ = directory_of(spec)
    return directory_renderer(path, name=name, chat_template=template)


def tiny_renderer(name: str, chat_template: str | None = None) -> TemplateRenderer:
    """The renderer of ``tiny-<name>``: its tokenizer, config and media family are built, its weights are not."""
    if name in TINY_MM:
        tokenizer, config = tiny_multimodal_text(name)
        modalities = frozenset(tiny_family(name, config, tokenizer).preparers)
        tokenizer = with_template(tokenizer, chat_template)
        return TemplateRenderer(tokenizer, name=f"tiny-{name}", modalities=modalities)
    tokenizer, _ = tiny_text(name)
    return TemplateRenderer(with_template(tokenizer, chat_template), name=f"tiny-{name}")


def directory_renderer(path: Path, *, name: str, chat_template: str | None = None) -> TemplateRenderer:
    """A model directory -> its renderer: config, tokenizer and (multimodal) processor settings; no weights."""
    config = read_config(path)
    if is_multimodal(config):
        tokenizer, family = load_multimodal_text(path, config, chat_template)
        return TemplateRenderer(tokenizer, name=name, modalities=frozenset(family.preparers))
    check_config(config)
    return TemplateRenderer(with_template(text_tokenizer(path), chat_template), name=name)


# ==================================================================== a model's text side


def read_config(path: Path) -> Any:
    """The config of the model directory ``path`` (read before anything else). Raises ModelLoadError."""
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{path} is not a Hugging Face model directory: it has no config.json")
    try:
        return AutoConfig.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"cannot read the config in {path}: {exc}") from exc


def text_tokenizer(path: Path) -> Any:
    """The tokenizer of the text model directory ``path`` (with its chat template, or none: a base model).

    Raises:
        ModelLoadError: unreadable.
    """
    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"cannot load the model in {path}: {exc}") from exc


def with_template(tokenizer: Any, template: str | None) -> Any:
    """``tokenizer`` with ``template`` (already read and compiled) as its chat template, replacing its own; as it
    is when None."""
    if template is not None:
        tokenizer.chat_template = template
    return tokenizer


def tiny_text(name: str) -> tuple[Any, Any]:
    """``(tokenizer, config)`` of the tiny text model ``tiny-<name>``, its family checked (refused ones raise)."""
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
