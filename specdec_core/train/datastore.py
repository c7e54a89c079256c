"""The retrieval drafter's datastore (drafters/retrieval.py) from a trainer's work folder: the
token ids of the target's replies to the training prompts, each after its prompt's last
PROMPT_TAIL tokens. The held-out shards, and the prompts built on them, stay out as the trainers
leave them out (dataset.load_sequences), so a head and a datastore of one work folder are
measured on the same held-out replies.

`python -m specdec_core.train_retrieval --preset NAME --work WORK --out DIR` writes DIR (the
format's two files and a README.md); the shards come from the EAGLE trainer
(`python -m specdec_core.train_eagle ... --data-only` writes them).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
from pathlib import Path

from ..drafters.retrieval import PROMPT_TAIL, Datastore
from .data import DataSettings, complete_shards
from .dataset import load_sequences

SETTINGS_FILE = "data_settings.json"


def build_datastore(work: Path, tokenizer, shards: int | None = None) -> tuple[Datastore, dict]:
    """(the datastore of the work folder's first `shards` shards (default: every complete one),
    what it was built from). ValueError (one line) for a folder without data."""
    data_dir = Path(work) / "data"
    try:
        recorded = json.loads((data_dir / SETTINGS_FILE).read_text())
    except (OSError, ValueError):
        raise ValueError(f"{data_dir} holds no trainer data ({SETTINGS_FILE}): write it with "
                         "python -m specdec_core.train_eagle ... --data-only") from None
    count = shards or len(complete_shards(data_dir, 1_000_000))
    names = {field.name for field in dataclasses.fields(DataSettings)} - {"shards"}
    train, _ = load_sequences(data_dir, DataSettings(shards=count, **{k: v for k, v in recorded.items() if k in names}),
                              tokenizer)
    if not train:
        raise ValueError(f"{data_dir} has no training replies in its first {count} shards: use more shards")
    store = Datastore.from_sequences(s.ids[max(s.reply_start - PROMPT_TAIL, 0) :].tolist() for s in train)
    about = {"work": str(work), "shards": count, "sequences": len(train),
             "reply_tokens": sum(s.reply_tokens for s in train), "data_settings": recorded}
    return store, about


def main(argv: list[str] | None = None) -> int:
    from ..cli import inform, run_guarded
    from ..presets.loading import load_preset

    p = argparse.ArgumentParser(prog="python -m specdec_core.train_retrieval", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", required=True, help="the preset whose target wrote the data (its tokenizer reads it)")
    p.add_argument("--work", required=True, help="a trainer's work folder (its data/)")
    p.add_argument("--out", required=True, help="the datastore folder to write")
    p.add_argument("--shards", type=int, help="the first N shards (default: every complete one)")
    p.add_argument("--config", help="a models.yaml other than the bundled one")
    argv = sys.argv[1:] if argv is None else argv
    args = p.parse_args(argv)

    def command() -> int:
        models = load_preset(args.preset, args.config, load_draft=False, compile=False, load_eagle=False,
                             load_medusa=False)
        store, about = build_datastore(Path(args.work), models.tokenizer, args.shards)
        out = Path(args.out)
        store.save(out, {"preset": args.preset, **about})
        (out / "README.md").write_text(_readme(shlex.join([*p.prog.split(), *argv]), args.preset, store, about))
        inform(f"wrote {out}: {store.tokens:,} tokens of {about['sequences']:,} replies "
               f"({about['reply_tokens']:,} reply tokens) from {about['shards']} shards")
        return 0

    return run_guarded(command)


def _readme(command: str, preset: str, store: Datastore, about: dict) -> str:
    settings = ", ".join(f"{key} {value}" for key, value in about["data_settings"].items())
    return f"""# Retrieval datastore for preset `{preset}`

The target's own replies, for drafter `retrieval` (specdec_core/drafters/retrieval.py): each round
drafts what the target most often wrote after the context's last 2-5 tokens.

```bash
{command}
```

- from: {about['shards']} data shards of `{about['work']}` ({settings}); the held-out shards and
  the prompts built on them left out
- {about['sequences']:,} training replies, {about['reply_tokens']:,} reply tokens; {store.tokens:,}
  tokens in the stream (each reply after its prompt's last {PROMPT_TAIL} tokens)
"""
