"""The weight phase: online rejection-sampling fine-tuning (RSFT) of the model under a fixed harness."""
