"""Chat templates: a base model loads without one, ``chat_template`` (``--chat-template FILE_OR_TEXT``) gives any
model another, compiled at start (errors name the line), rendered in transformers' sandboxed Jinja environment
(no Python internals, no files), with typed errors; its digest is part of the fingerprint."""

from __future__ import annotations

import pytest
import torch

from chat.engine.errors import ChatTemplateError, NoChatTemplateError
from chat.models import InvalidSettingError, load_model, load_renderer
from chat.models.chat_template import check_compiles, digest, read_template, render_text

torch.set_num_threads(1)

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PLAIN = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:"
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def tokenizer():
    return load_renderer("tiny-llama")._tokenizer


def rendered(tokenizer, template: str) -> str:
    tokenizer.chat_template = template
    return render_text(tokenizer, USER, model="m")


def test_a_base_model_loads_and_refuses_to_render_chat():
    model = load_model("tiny-base")
    assert model.chats is False and model.name == "tiny-base"
    assert model.encode("one two") == load_model("tiny-llama").encode("one two")
    with pytest.raises(NoChatTemplateError, match="--chat-template"):
        model.render(USER)
    with pytest.raises(NoChatTemplateError, match="tiny-base"):
        model.render_prompt(USER)
    renderer = load_renderer("tiny-base")
    assert renderer.chats is False
    with pytest.raises(NoChatTemplateError):
        renderer.render(USER)


def test_a_template_given_as_text_or_file_replaces_the_models_own(tmp_path):
    file = tmp_path / "plain.jinja"
    file.write_text(PLAIN)
    for value in (PLAIN, str(file)):
        model = load_model("tiny-llama", chat_template=value)
        assert model.chats
        assert model.render(USER) == model.encode("user: hi\nassistant:")
        assert load_renderer("tiny-base", chat_template=value).render(USER) == model.render(USER)


def test_two_templates_give_two_namespaces_and_the_same_template_the_same():
    base = load_model("tiny-base").fingerprint
    chatml = load_model("tiny-base", chat_template=CHATML).fingerprint
    plain = load_model("tiny-base", chat_template=PLAIN).fingerprint
    assert len({base, chatml, plain}) == 3
    assert load_model("tiny-base", chat_template=CHATML).fingerprint == chatml
    assert digest(None) == "none" and digest(CHATML) != digest(PLAIN)


@pytest.mark.parametrize(
    ("template", "line", "fragment"),
    [
        ("{% for m in messages %}\n{{ m.content }\n{% endfor %}", 2, "unexpected '}'"),
        ("line one\nline two\n{% if %}", 3, "Expected an expression"),
        ("{% for m in messages %}{{ m }}", 1, "endfor"),
    ],
)
def test_a_template_that_does_not_compile_is_refused_at_load_naming_its_line(template, line, fragment):
    with pytest.raises(InvalidSettingError, match=f"line {line}: .*{fragment}") as info:
        load_model("tiny-llama", chat_template=template)
    assert info.value.field == "chat_template"


def test_a_template_file_that_cannot_be_used_is_refused(tmp_path):
    with pytest.raises(InvalidSettingError, match="no such file"):
        read_template(str(tmp_path / "missing.jinja"))
    (tmp_path / "empty.jinja").write_text("  \n")
    with pytest.raises(InvalidSettingError, match="empty"):
        read_template(str(tmp_path / "empty.jinja"))
    (tmp_path / "bad.jinja").write_text("ok\n\n{{ x }\n")
    with pytest.raises(InvalidSettingError, match=r"bad\.jinja: line 3"):
        read_template(str(tmp_path / "bad.jinja"))
    with pytest.raises(InvalidSettingError):
        read_template("   ")


def test_escapes_from_the_sandbox_fail(tokenizer):
    assert "class" not in rendered(tokenizer, "{{ ''.__class__ }}")  # an unsafe attribute is undefined: nothing
    for escape in (
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
        "{{ messages.__class__.__base__.__subclasses__() }}",
        "{{ raise_exception.__globals__['__builtins__']['open']('/etc/passwd').read() }}",
        "{{ namespace(_x=1) }}",
    ):
        with pytest.raises(ChatTemplateError, match=r"SecurityError|undefined") as info:
            rendered(tokenizer, escape)
        assert info.value.line == 1


def test_no_file_can_be_read_from_a_template(tokenizer):
    for reading in ("{% include '/etc/passwd' %}", "{% import '/etc/hostname' as h %}", "{% extends '/etc/passwd' %}"):
        with pytest.raises(ChatTemplateError, match="no loader"):
            rendered(tokenizer, reading)
    assert "root:" not in rendered(tokenizer, "{{ '/etc/passwd' | string }}")


def test_a_template_that_raises_while_rendering_names_the_error_and_its_line(tokenizer):
    template = (
        "{% for m in messages %}\n\n{% if m.role == 'user' %}{{ raise_exception('users may not speak') }}{% endif %}"
        "{% endfor %}"
    )
    with pytest.raises(ChatTemplateError, match="users may not speak") as info:
        rendered(tokenizer, template)
    assert info.value.line == 3
    with pytest.raises(ChatTemplateError, match="line 2: TypeError") as info:
        rendered(tokenizer, "ok\n{{ 1 + 'a' }}")
    with pytest.raises(ChatTemplateError, match="UndefinedError"):
        rendered(tokenizer, "{{ messages[7].content }}")


def test_the_compile_check_is_the_renderers_own():
    check_compiles(CHATML)
    check_compiles("{% generation %}{{ x }}{% endgeneration %}")  # transformers' own tag compiles
    check_compiles("{% for x in y %}{% break %}{% endfor %}")  # and its loop controls


class _Tokenizer:
    """What turn_end_ids reads of a tokenizer."""

    unk_token_id = 3
    all_special_tokens = ("<eos>", "<bos>")

    def __init__(self, template):
        self.chat_template = template
        self.added_tokens_encoder = {"<start_of_turn>": 105, "<end_of_turn>": 106}

    def convert_tokens_to_ids(self, token: str) -> int:
        return {"<eos>": 1, "<bos>": 2, **self.added_tokens_encoder}.get(token, self.unk_token_id)


def test_the_end_of_turn_marker_a_template_writes_ends_a_reply():
    from chat.models.registry import turn_end_ids

    gemma_style = "{% for m in messages %}<start_of_turn>{{ m.content }}<end_of_turn>\n{% endfor %}"
    assert turn_end_ids(_Tokenizer(gemma_style)) == {106}
    assert turn_end_ids(_Tokenizer("{% for m in messages %}{{ m.content }}<|im_end|>{% endfor %}")) == set()  # unknown
    assert turn_end_ids(_Tokenizer(None)) == set()  # a base model: its EOS alone
    assert load_model("tiny-base").eos_token_ids == load_model("tiny-base", chat_template=CHATML).eos_token_ids
