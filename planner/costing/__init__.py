"""Costing: the execution description (what a software stack does) beside the model and the hardware."""
