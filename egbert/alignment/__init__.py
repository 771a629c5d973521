"""Aligning a model with preferences, on TRL: `egbert reward` trains a scoring model on
preference pairs (reward.py, with TRL's RewardTrainer), from files, data sets or a labelled task
(pairs.py)."""
