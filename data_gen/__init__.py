"""Task data for RecaLLM: task generators, augmentations, length fitting, SFT traces.

So far: ``data_gen.toy`` (key-value prompts over the tiny model's toy vocabulary).
"""
