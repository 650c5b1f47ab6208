"""The RecaLLM composite reward (format, answer metrics, interval-F1 recall, penalties).

Delivered by the reward issue; the package is installed from the start so that the layout in
DESIGN.md holds.
"""
