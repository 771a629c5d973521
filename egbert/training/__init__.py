"""The trainer and what serves only it: batches, each step's numbers, evaluation, checkpoints,
the saved models, optimization and the runtime's device facts.

`trainer.Trainer` is the one training loop of pretraining and fine-tuning; the modules beside it
are its parts, each readable alone. Loading a saved model is egbert.model_files', below it.
"""
