"""Whole models: presets of real models' attention and the cost of a model's layers."""
