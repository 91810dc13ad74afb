"""examples/eval: the generated media are what the dataset names, and the dataset runs end to end."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from chat.tools.evaluation import EvalConversation, EvalOptions, load_dataset, run_eval
from chat.tools.evaluation.dataset import MediaItem, missing_media, turn_content
from tests.chat.tools.client.helpers import fake_server

EXAMPLE = Path(__file__).resolve().parents[4] / "examples" / "eval"


def test_the_example_dataset_runs_with_generated_media(tmp_path: Path):
    subprocess.run(
        [sys.executable, str(EXAMPLE / "make_media.py"), "--out", str(tmp_path / "media")],
        check=True,
        capture_output=True,
    )
    dataset = Path(shutil.copy(EXAMPLE / "dataset.jsonl", tmp_path / "dataset.jsonl"))
    entries = load_dataset(dataset)
    assert len(entries) == 6 and all(isinstance(e, EvalConversation) for e in entries)
    assert all(2 <= len(e.turns) <= 4 and not missing_media(e, tmp_path) for e in entries)
    kinds = {
        item.type
        for e in entries
        for t in e.turns
        if not isinstance(t.content, str)
        for item in t.content
        if isinstance(item, MediaItem)
    }
    assert kinds == {"image", "audio", "video"}
    for e in entries:
        for turn in e.turns:
            turn_content(turn, tmp_path)  # every file is recognized
    media_turns = sum(1 for e in entries for t in e.turns if not isinstance(t.content, str))
    with fake_server() as (_, url):
        run = run_eval(EvalOptions(dataset=dataset, url=url, out=tmp_path / "out.jsonl", progress=False))
    assert run.summary.turns == sum(len(e.turns) for e in entries)
    assert run.summary.error_codes == {"invalid_media": media_turns}  # the fake model is text-only
    assert run.summary.references > 0
