"""Adapters from Crucible's rollouts to trainers' own loops (``trl``: TRL's ``GRPOTrainer``)."""
