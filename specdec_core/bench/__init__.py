"""The benchmark wing: `python -m specdec_core.bench [run | ceiling | cost-model | gpu-check]`.

cli.py reads the command line and dispatches; each command's work sits in its own module:
run.py (our engine against Hugging Face's decoding on Spec-Bench questions: its flow),
methods.py (what is timed), questions.py, theory_check.py (measured speedups against Leviathan
et al.'s prediction), report.py (its tables and plots); ceiling.py (the engine at controlled
acceptance, with synthetic.py's drafter) and ceiling_report.py; cost_model.py (per-step costs
of random-weight models) and cost_model_report.py; gpu_check/ (the GPU path, one module per
part). Shared: machine.py (what the reports record of the machine, versions, bandwidth) and
architectures.py (random-weight models of the real sizes in data/architectures.yaml).
`python -m specdec_core.cost_model` and `python -m specdec_core.gpu_check` are entry points too.
"""
