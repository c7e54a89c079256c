"""The presets wing: models.yaml -> validated presets (config.py), where weights come from
(sources.py), and loading a preset's models and drafters for this machine (loading.py). It
sits above the engine and the drafters and builds them."""
