"""lm-evaluation-harness against the server, fully offline, on tiny-llama.

``local-completions`` scores the multiple-choice task of ``lm_eval_task/`` through ``/v1/completions`` with
``echo: true, logprobs: 1, max_tokens: 1`` on token-id prompts (lm-eval sums ``token_logprobs[ctxlen:-1]`` and
calls a continuation greedy when each of its ``token_logprobs`` equals the max of that position's
``top_logprobs``); the log-likelihoods it reports must be the model's own, computed here by a direct forward of the
loaded adapter on the same tokens. It also runs the generate_until task on token-id prompts (``stop``,
``max_tokens``), and ``local-chat-completions`` runs it through ``/v1/chat/completions``; both must give the
model's greedy reply. A base model (``tiny-base``: the same weights, no chat template) is scored through
``/v1/completions`` the same way.

lm-eval is an optional tool (``pip install lm-eval==0.4.13``); the module is skipped without it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml

from chat.models import load_model
from chat.models.tiny.tokenizer import ASSET_DIR
from tests.chat.server.conftest import make_server

TASK_DIR = Path(__file__).parent / "lm_eval_task"
TOKENIZER_DIR = ASSET_DIR  # the tiny models' tokenizer
MC, GEN = "turncache_tiny_mc", "turncache_tiny_gen"
KEY = "lm-eval-test-key"  # the server requires it; lm-eval sends $OPENAI_API_KEY as the bearer token
MAX_GEN_TOKS = 8  # turncache_tiny_gen.yaml's max_gen_toks
BATCH = 4  # prompts per /v1/completions request (a list of token-id lists)


@dataclass
class Exchange:
    path: str
    request: object
    status: int | None
    response: bytes

    def json(self):
        return json.loads(self.response)


class Recorder:
    """ASGI middleware that keeps every /v1/ request body and the response bytes sent for it."""

    def __init__(self, app, log: list[Exchange]):
        self.app, self.log = app, log

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            return await self.app(scope, receive, send)
        body, out, status = bytearray(), bytearray(), {}

        async def receive_():
            message = await receive()
            if message["type"] == "http.request":
                body.extend(message.get("body", b""))
            return message

        async def send_(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            elif message["type"] == "http.response.body":
                out.extend(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive_, send_)
        finally:
            request = json.loads(body) if body else None
            self.log.append(Exchange(scope["path"], request, status.get("code"), bytes(out)))


@pytest.fixture(scope="module")
def offline_lm_eval(tmp_path_factory):
    """lm_eval, imported with the Hugging Face libraries offline and their caches in a temporary directory."""
    home = tmp_path_factory.mktemp("hf_home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_DATASETS_OFFLINE", "1")
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("HF_HOME", str(home))  # effective only if no Hugging Face library was imported yet
        mp.setenv("OPENAI_API_KEY", KEY)  # read per request by local-completions / local-chat-completions
        import lm_eval  # a dev dependency (pyproject.toml): its absence is a failure, not a skip
        from lm_eval.tasks import TaskManager

        tasks = tmp_path_factory.mktemp("lm_eval_tasks")
        for path in TASK_DIR.glob("*.yaml"):
            config = yaml.safe_load(path.read_text())
            kwargs = config["dataset_kwargs"]
            # datasets.load_dataset resolves relative data_files against the cwd: make them absolute
            kwargs["data_files"] = {split: str(TASK_DIR / name) for split, name in kwargs["data_files"].items()}
            kwargs["cache_dir"] = str(home / "datasets")
            (tasks / path.name).write_text(yaml.safe_dump(config))
        yield lm_eval, TaskManager(include_path=str(tasks), include_defaults=False)


@pytest.fixture(scope="module")
def served():
    torch.set_num_threads(1)
    runtime = load_model("tiny-llama")
    engine, srv = make_server(runtime=runtime, auth_token=KEY)
    log: list[Exchange] = []
    srv.app.add_middleware(Recorder, log=log)
    with srv:
        yield srv, runtime, log
    engine.close()


def model_args(srv, path: str, **extra) -> str:
    args = {"model": "tiny-llama", "base_url": srv.url + path, "num_concurrent": 1, "max_retries": 1, **extra}
    return ",".join(f"{k}={v}" for k, v in args.items())


@pytest.fixture(scope="module")
def completions_run(offline_lm_eval, served):
    lm_eval, task_manager = offline_lm_eval
    srv, _, log = served
    start = len(log)
    out = lm_eval.simple_evaluate(
        model="local-completions",
        model_args=model_args(
            srv,
            "/v1/completions",
            tokenizer=TOKENIZER_DIR,
            tokenizer_backend="huggingface",
            tokenized_requests=True,
            max_length=4096,
        ),
        tasks=[MC, GEN],
        task_manager=task_manager,
        batch_size=BATCH,
        log_samples=True,
    )
    return out, log[start:]


@pytest.fixture(scope="module")
def base_completions_run(offline_lm_eval):
    """The same local-completions run on tiny-base: tiny-llama's weights without a chat template (a base model)."""
    lm_eval, task_manager = offline_lm_eval
    runtime = load_model("tiny-base")
    assert runtime.chats is False
    engine, srv = make_server(runtime=runtime, auth_token=KEY)
    log: list[Exchange] = []
    srv.app.add_middleware(Recorder, log=log)
    with srv:
        out = lm_eval.simple_evaluate(
            model="local-completions",
            model_args=model_args(
                srv,
                "/v1/completions",
                model="tiny-base",
                tokenizer=TOKENIZER_DIR,
                tokenizer_backend="huggingface",
                tokenized_requests=True,
                max_length=4096,
            ),
            tasks=[MC, GEN],
            task_manager=task_manager,
            batch_size=BATCH,
            log_samples=True,
        )
    engine.close()
    return out, log


@pytest.fixture(scope="module")
def chat_run(offline_lm_eval, served):
    lm_eval, task_manager = offline_lm_eval
    srv, _, log = served
    start = len(log)
    out = lm_eval.simple_evaluate(
        model="local-chat-completions",
        model_args=model_args(srv, "/v1/chat/completions"),
        tasks=[GEN],
        task_manager=task_manager,
        apply_chat_template=True,
        log_samples=True,
    )
    return out, log[start:]


# ---------------------------------------------------------------- references, straight from the adapter


def encode_pair(runtime, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's TemplateLM._encode_pair for a causal model (trailing spaces of the context move to the
    continuation; the continuation is what encoding the whole adds after the context's tokens)."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole, ctx = runtime.encode(context + continuation), runtime.encode(context)
    return ctx, whole[len(ctx) :]


def logits_of(runtime, ids: list[int]) -> torch.Tensor:
    run = runtime.new_run()
    try:
        return runtime.forward(run, ids).double()
    finally:
        runtime.close_run(run)


def direct_loglikelihood(runtime, ids: list[int], ctxlen: int) -> tuple[float, bool]:
    logp = torch.log_softmax(logits_of(runtime, ids), dim=-1)
    ll = sum(float(logp[i - 1, ids[i]]) for i in range(ctxlen, len(ids)))
    greedy = all(int(logp[i - 1].argmax()) == ids[i] for i in range(ctxlen, len(ids)))
    return ll, greedy


def greedy_reply(runtime, prompt: list[int], stops: list[str]) -> str:
    run = runtime.new_run()
    try:
        logits, out = runtime.forward(run, prompt, last_only=True), []
        while len(out) < MAX_GEN_TOKS:
            token = int(logits[-1].argmax())
            if token in runtime.eos_token_ids:
                break
            out.append(token)
            logits = runtime.forward(run, [token], last_only=True)
    finally:
        runtime.close_run(run)
    text = runtime.decode(out)
    for stop in stops:
        text = text.split(stop)[0] if stop else text
    return text


def docs() -> list[dict]:
    return [json.loads(line) for line in (TASK_DIR / "tiny_qa.jsonl").read_text().splitlines() if line.strip()]


def by_doc(samples: list[dict]) -> list[dict]:
    return sorted(samples, key=lambda s: s["doc_id"])


# ---------------------------------------------------------------- tests


def test_multiple_choice_loglikelihoods_are_the_models(completions_run, served):
    out, exchanges = completions_run
    _, runtime, _ = served
    scoring = [e for e in exchanges if e.path == "/v1/completions" and e.request.get("echo")]
    n_requests = sum(len(d["choices"]) for d in docs())
    assert len(docs()) == 6 and n_requests == 18
    assert len(scoring) == math.ceil(n_requests / BATCH), [e.request for e in scoring]
    assert all(e.status == 200 for e in scoring), [(e.status, e.response[:300]) for e in scoring]
    for e in scoring:  # what lm-eval sends for a loglikelihood
        assert e.request["logprobs"] == 1 and e.request["max_tokens"] == 1 and e.request["temperature"] == 0
        assert all(isinstance(p, list) and all(isinstance(t, int) for t in p) for p in e.request["prompt"])
    sent = sorted(tuple(p) for e in scoring for p in e.request["prompt"])

    samples = by_doc(out["samples"][MC])
    assert [s["doc"]["question"] for s in samples] == [d["question"] for d in docs()]
    expected, correct = [], 0
    for sample in samples:
        lls = []
        for (context, continuation), (got,) in zip(sample["arguments"], sample["resps"], strict=True):
            ctx, cont = encode_pair(runtime, context, continuation)
            want = direct_loglikelihood(runtime, ctx + cont, len(ctx))
            assert got[0] == pytest.approx(want[0], abs=1e-4), (context, continuation)
            assert bool(got[1]) == want[1], (context, continuation)
            expected.append(tuple(ctx + cont))
            lls.append(want[0])
        correct += max(range(len(lls)), key=lls.__getitem__) == sample["target"]
    assert sent == sorted(expected)  # the server scored exactly the token sequences lm-eval built

    acc = out["results"][MC]["acc,none"]
    assert 0.0 <= acc <= 1.0
    assert acc == pytest.approx(correct / len(samples))


def test_echo_logprobs_have_the_openai_shape(completions_run, served):
    """Each prompt of an ``echo: true, logprobs: 1, max_tokens: 1`` request gets, in order, one choice whose
    logprobs cover the prompt's tokens (the first ``None``) and then the one generated token."""
    _, exchanges = completions_run
    _, runtime, _ = served
    for e in (e for e in exchanges if e.path == "/v1/completions" and e.request.get("echo")):
        body = e.json()
        assert body["object"] == "text_completion"
        choices = sorted(body["choices"], key=lambda c: c["index"])
        assert [c["index"] for c in choices] == list(range(len(e.request["prompt"])))
        for prompt, choice in zip(e.request["prompt"], choices, strict=True):
            lp = choice["logprobs"]
            n = len(prompt) + 1
            assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == n
            assert len(lp["text_offset"]) == n
            assert lp["token_logprobs"][0] is None
            assert all(isinstance(x, float) and x <= 0.0 for x in lp["token_logprobs"][1:])
            assert all(isinstance(top, dict) and 1 <= len(top) <= 2 for top in lp["top_logprobs"][1:])
            for token_lp, top in zip(lp["token_logprobs"][1:], lp["top_logprobs"][1:], strict=True):
                assert max(top.values()) >= token_lp  # what lm-eval's is_greedy compares
            assert choice["text"].startswith(runtime.decode(prompt))  # echo: the prompt, then the completion
            # ASCII prompts: the prompt's tokens spell it, and each offset is where its token starts in `text`
            assert "".join(lp["tokens"][: len(prompt)]) == runtime.decode(prompt)
            assert lp["text_offset"] == [len("".join(lp["tokens"][:k])) for k in range(n)]
            # the echoed logprobs are the model's (the first token has no context)
            logp = torch.log_softmax(logits_of(runtime, prompt), dim=-1)
            want = [float(logp[i - 1, prompt[i]]) for i in range(1, len(prompt))]
            assert lp["token_logprobs"][1 : len(prompt)] == pytest.approx(want, abs=1e-4)


def test_generate_until_on_completions_is_the_greedy_reply(completions_run, served):
    out, exchanges = completions_run
    _, runtime, _ = served
    gens = [e for e in exchanges if e.path == "/v1/completions" and not e.request.get("echo")]
    assert len(gens) == math.ceil(len(docs()) / BATCH)
    assert all(e.status == 200 for e in gens), [(e.status, e.response[:300]) for e in gens]
    for e in gens:
        assert e.request["max_tokens"] == MAX_GEN_TOKS and e.request["temperature"] == 0
        assert e.request["stop"] == ["\n", "<|im_end|>"]  # the task's `until` and the tokenizer's eos string
        choices = e.json()["choices"]
        assert sorted(c["index"] for c in choices) == list(range(len(e.request["prompt"])))
        for prompt, choice in zip(e.request["prompt"], sorted(choices, key=lambda c: c["index"]), strict=True):
            assert choice["text"] == greedy_reply(runtime, prompt, e.request["stop"])
            assert choice["finish_reason"] in ("stop", "length")

    samples = by_doc(out["samples"][GEN])
    assert len(samples) == len(docs())
    for sample in samples:
        ((context, gen_kwargs),) = sample["arguments"]
        assert gen_kwargs["until"] == ["\n"] and gen_kwargs["max_gen_toks"] == MAX_GEN_TOKS
        assert sample["resps"] == [[greedy_reply(runtime, runtime.encode(context), ["\n"])]]
    em = out["results"][GEN]["exact_match,remove_whitespace"]
    assert 0.0 <= em <= 1.0


def test_a_base_model_is_scored_and_generates_through_completions(base_completions_run, completions_run):
    """tiny-base (no chat template) serves lm-eval's log-likelihood and generate_until over /v1/completions: every
    request answered, and every result the same as tiny-llama's (the same weights), which the tests above check
    against the model's own forward."""
    base_out, base_log = base_completions_run
    chat_out, _ = completions_run
    assert base_log and all(e.path == "/v1/completions" and e.status == 200 for e in base_log), [
        (e.path, e.status, e.response[:300]) for e in base_log
    ]
    for task in (MC, GEN):
        base, chat = by_doc(base_out["samples"][task]), by_doc(chat_out["samples"][task])
        assert [s["resps"] for s in base] == [s["resps"] for s in chat], task
    assert base_out["results"][MC]["acc,none"] == chat_out["results"][MC]["acc,none"]


def test_chat_completions_generate_until_is_the_greedy_reply(chat_run, served):
    out, exchanges = chat_run
    _, runtime, _ = served
    assert len(exchanges) == len(docs())  # chat completions are never batched
    assert all(e.path == "/v1/chat/completions" and e.status == 200 for e in exchanges), [
        (e.path, e.status, e.response[:300]) for e in exchanges
    ]
    replies = {}
    for e in exchanges:
        assert e.request["max_tokens"] == MAX_GEN_TOKS and e.request["temperature"] == 0
        assert e.request["stop"] == ["\n"]  # no tokenizer, so no eos string is added
        (message,) = e.request["messages"]
        body = e.json()
        assert body["object"] == "chat.completion"
        (choice,) = body["choices"]
        prompt = runtime.render(e.request["messages"])
        assert choice["message"]["content"] == greedy_reply(runtime, prompt, ["\n"])
        replies[message["content"]] = choice["message"]["content"]

    samples = by_doc(out["samples"][GEN])
    assert len(samples) == len(docs())
    for sample, doc in zip(samples, docs(), strict=True):
        assert sample["resps"] == [[replies[f"Q: {doc['question']}\nA:"]]]
    em = out["results"][GEN]["exact_match,remove_whitespace"]
    assert 0.0 <= em <= 1.0
