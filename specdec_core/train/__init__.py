"""The trainer wing: train an EAGLE-3 draft head for a preset's target (python -m specdec_core.train_eagle)."""
