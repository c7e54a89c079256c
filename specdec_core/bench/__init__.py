"""The benchmark wing: our engine against Hugging Face's decoding on Spec-Bench questions.

run.py (the command and its flow), methods.py (what is timed), questions.py, theory_check.py
(measured speedups against Leviathan et al.'s prediction), report.py (tables, plots),
cost_model.py (per-step costs of random-weight models), machine.py (what the reports record).
`python -m specdec_core.bench` runs it; `python -m specdec_core.cost_model` the cost model.
"""
