"""Tiny seeded models, one per cache kind and media family: what ``--model tiny-<name>`` loads (tests, and trying
the server without weights). ``text`` (the text families: :data:`chat.models.tiny.text.TINY`), ``media`` (the
multimodal ones: :data:`chat.models.tiny.media.TINY_MM`), ``tokenizer`` (the small tokenizer they share, committed
under ``assets/``), ``templates`` (chat templates of the variants that take tools or think). Imported only when a
tiny spec is loaded."""
