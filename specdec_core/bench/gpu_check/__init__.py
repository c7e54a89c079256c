"""The GPU path checked and measured in one command, with random weights of real shapes.

    python -m specdec_core.bench gpu-check --out DIR   (or python -m specdec_core.gpu_check --out DIR)

Random weights of real shapes (Qwen2.5-7B target, Qwen2.5-0.5B draft), no network, one GPU,
meant to finish in well under 10 minutes. Parts, each timed, each recorded as pass / fail /
not run (with the reason) in DIR/gpu_check.json and DIR/gpu_check.md, rewritten after every
part so a run cut short still leaves what it measured; a part that fails does not stop the rest:

    correctness  (correctness.py) fp32 with TF32 off: greedy output of every drafter (draft
                 model, prompt lookup, EAGLE when this build has it), eager and compiled, against
                 plain decoding through our engine, and our plain decoding against HF generate()
    fast_path    (speed.py) bf16, compiled: compile time per model, whether CUDA graphs ran
                 (inductor's skip counter), the cost model's table (eager and compiled step
                 times, c, baseline tokens/s against the bandwidth ceiling, predicted speedups)
    ceiling      (speed.py) the engine at controlled acceptance (bench/ceiling.py) on the
                 compiled bf16 target, the synthetic drafter costing the measured draft model's c
    bf16_ties    (ties.py) how often greedy speculative output differs from plain decoding in
                 bf16, and the logit gap where it does (ties under rounding: a 1-token step and
                 a (k+1)-token verify round differently)
    loading      (presets.py) the preset loader on random-weight presets saved to a local folder:
                 bf16, draft on cuda:0, target device_map="auto", an nf4 draft through bitsandbytes
    eagle_cost   (speed.py) the cost model over the EAGLE-3 target (Llama-3.1-8B shapes), with a
                 head of its shape
    app          (app.py) `python app.py` on such a preset, one message through gradio_client:
                 time to first token, tokens/s, the models panel's decode path

check.py runs them and report.py writes the report; part.py holds the scale and the record,
fixtures.py the models and engines the parts share. `--tiny` runs every part on the CPU with
tiny configs in about a minute (a test in CI).
"""

from .check import PART_FUNCTIONS, PARTS, gpu_check, run_check
from .part import FAIL, FULL, NOT_RUN, PASS, TINY, Check, Part, Scale
from .presets import word_tokenizer, write_presets

__all__ = ["FAIL", "FULL", "NOT_RUN", "PART_FUNCTIONS", "PARTS", "PASS", "TINY", "Check", "Part", "Scale",
           "gpu_check", "run_check", "word_tokenizer", "write_presets"]
