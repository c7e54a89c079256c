"""The presets wing: models.yaml -> validated presets (config.py), where weights come from
(sources.py), the preset `auto` picks (auto.py), loading a preset's models for this machine
(loading.py, with one-line errors from load_errors.py; its heads: heads.py; its compiled decode
steps: runners.py), the loaded models and the engines and
drafters they make (loaded.py), and the one loaded preset a server shares (holder.py). It sits
above the engine and the drafters and builds them."""
