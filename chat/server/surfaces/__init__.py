"""The APIs clients speak, one module each: OpenAI's chat completions (``openai_api``), legacy completions
(``completions_api``) and Responses (``responses_api``), Anthropic's Messages (``anthropic_api``), vLLM's tokenize
(``tokenize_api``) and LoRA admin routes (``lora_api``), and the chat WebSocket (``ws``). Each turns its wire request
into turns (``chat.server.reply``) and the reply's events into its wire events. A surface's wire bodies and events
are typed models in a module of their own beside it (``openai_types``, ``completions_types``, ``responses_types``,
``anthropic_types``)."""
