"""Evaluation of a chat server on a dataset of multi-turn (multimodal) conversations: `turncache eval`.

- :mod:`chat.tools.evaluation.dataset`: the JSONL format (one conversation per line, media as paths), parsed without
  raising for bad lines;
- :mod:`chat.tools.evaluation.runner`: runs conversations concurrently over the WebSocket (stateful sessions or
  stateless ``completion.create``), resumes interrupted runs;
- :mod:`chat.tools.evaluation.results`: per-turn records, exact match, the results file;
- :mod:`chat.tools.evaluation.summary`: the summary figures and table.

The format and every figure are specified in docs/eval.md.
"""

from __future__ import annotations

from chat.tools.evaluation.dataset import BadLine, EvalConversation, EvalTurn, load_dataset
from chat.tools.evaluation.results import exact_match, normalize
from chat.tools.evaluation.runner import EvalOptions, EvalRun, EvalUsageError, main, run_conversation, run_eval
from chat.tools.evaluation.summary import Summary, format_summary, percentile, summarize

__all__ = [
    "BadLine",
    "EvalConversation",
    "EvalOptions",
    "EvalRun",
    "EvalTurn",
    "EvalUsageError",
    "Summary",
    "exact_match",
    "format_summary",
    "load_dataset",
    "main",
    "normalize",
    "percentile",
    "run_conversation",
    "run_eval",
    "summarize",
]
