"""The SFT cold start: data and collator, the embedding-stage freeze, the Trainer recipe."""
